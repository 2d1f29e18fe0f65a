"""The joiner (Photon §3.3) as a Spark micro-batch: look up, judge, register, write.

One call processes one work unit's clicks. Its costly part is one Spark job: the clicks,
deduplicated, go through
1. lookup: one call per partition to the registry service, which answers with each click's registry
   entry (the dispatcher lookup: a click registered under another token is skipped; one older than
   the registry's GC boundary is unjoinable, too old) and its query's line and time if the
   EventStore's memory tier holds it (resources/event_store/memory_tier.py);
2. judge: each click's outcome: joined, invalid timestamp (spark_ops/validity.py), given up or
   still pending (spark_ops/pending.py); with an adapter (business logic over (click, query) pairs
   that may alter or drop rows) or the per-query cap (resources/registry/click_caps.py), the joined pairs
   are refined in a second job;
3. commit: every id this work unit resolves, conditionally registered with its token, by the same
   tasks;
into the unit's staging directory, with the counts the pass reports observed while it is written.
Misses the memory tier cannot vouch for (older than its horizon) are looked up in the durable and
logs tiers (spark_ops/query_tiers.py) and judged and committed by a second job; a live stream has
none.
4. write: the winners appended to `joined_clicks` (their query line parsed into the output's struct
   on the way) and `unjoinable_clicks` (merged on `click_id` by a retry: spark_ops/tables.py), and
   the pending clicks' records, side by side (the records after the outputs when the unit retried
   pending clicks); once that output is durable, the token is cleared.
The unit's ledger append runs beside the plan's building (JoinInput.record); the commit waits for
it, so every id a unit registers has its ledger row, recovery's source when the unit never writes
its output (spark_ops/verification.py).
A crash anywhere leaves a state from which the same work unit, retried, produces exactly the
output a clean run would have (see tests/spark_ops/test_join.py for each crash point).
"""

from __future__ import annotations

import importlib
import shutil
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from resources.registry.api import IdRegistry
from spark_ops.beside import beside, settle, settle_quietly, side_by_side
from spark_ops.query_tiers import EventStore, EventStoreStats, event_id_parts
from spark_ops.handoff import materialize, materialize_counted
from spark_ops.parse import with_query_struct
from spark_ops.pending import STREAM_PROGRESS, PendingPolicy, record_pending
from spark_ops.registry_calls import RunColumns, commit_ids, grant_clicks, lookup_clicks
from spark_ops.tables import CLICK_EVENT, TABLE_SCHEMAS, write_output
from spark_ops.validity import BEFORE_QUERY_REASON, FUTURE_REASON, LATEST_VALID, TimestampValidity

Adapter = Callable[[DataFrame], DataFrame]

# Points between the join's side effects where a crash must leave a retryable state.
# The last: a retry then finds its clicks registered under no token, its output already written.
CRASH_POINTS = ("before_registry_commit", "after_registry_commit", "after_output_write", "after_clear_tokens")


def default_adapter(pairs: DataFrame) -> DataFrame:
    """Copies the whole query into the joined row: the pairs already have that shape."""
    return pairs


def load_adapter(spec: str) -> Adapter:
    """`module:function` of an adapter; it takes and returns DataFrames of (click columns, query)."""
    module, _, name = spec.partition(":")
    if not name:
        raise ValueError(f"adapter {spec!r} is not of the form module:function")
    return getattr(importlib.import_module(module), name)


TOO_OLD_REASON = "older than the registry's garbage-collection boundary"
CAPPED_REASON = "capped: its query reached max_clicks_per_query"
DROPPED_REASON = "dropped by adapter"
CLICK_FIELDS = [f.name for f in CLICK_EVENT]
# What a click is after the lookup: registered under another token, too old, from the future, its
# query held in memory, not held though the memory tier would hold it (the query was never
# ingested), not held and older than what the memory tier vouches for (the other tiers are asked),
# or its query's writer not ingested up to the query's time.
STATES = TAKEN, TOO_OLD, FUTURE, IN_MEMORY, NOT_HELD, BEYOND_MEMORY, NOT_INGESTED = (
    "taken", "too_old", "future", "in_memory", "not_held", "beyond_memory", "not_ingested")
JUDGED_STATES = (FUTURE, IN_MEMORY, NOT_HELD, NOT_INGESTED)
JOINED, DROPPED, GIVEN_UP, INVALID, CAPPED, PENDING = "joined", "dropped", "given_up", "invalid", "capped", "pending"
UNJOINABLE_OUTCOMES = (DROPPED, GIVEN_UP, INVALID, CAPPED)
# JoinStats counts that are the EventStore's (reported as eventstore_*).
EVENT_STORE_COUNTS = tuple(f.name for f in fields(EventStoreStats))


@dataclass
class JoinStats(EventStoreStats):
    """A click pass's counts: the EventStore's (EVENT_STORE_COUNTS), the clicks' and the phases'."""

    looked_up: int = 0  # distinct clicks of the unit (new lines and retried pending clicks) looked up
    skipped_registered: int = 0
    pending: int = 0
    joined: int = 0
    dropped_by_adapter: int = 0
    given_up: int = 0  # pending too long: recorded as unjoinable
    too_old: int = 0  # older than the registry's GC boundary: recorded as unjoinable
    invalid_timestamp: int = 0  # from the future, or before its query: recorded as unjoinable
    capped: int = 0  # past its query's click cap: recorded as unjoinable
    refused: int = 0  # wasted joins: joined here, refused by the registry
    beyond_memory: int = 0  # misses older than what the memory tier vouches for: the other tiers asked
    phase_seconds: dict[str, float] = field(default_factory=dict)
    # Click time minus query time of the clicks joined (window advice, Facebook §6.5): p50, p99, max.
    delay_seconds: dict[str, float] = field(default_factory=dict)
    # From the event time of the clicks joined to their output commit: p50, p90.
    latency_seconds: dict[str, float] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return {k: v for k, v in asdict(self).items() if k not in ("phase_seconds", "delay_seconds", "latency_seconds")}

    @property
    def memory_hit_ratio(self) -> float | None:
        asked = self.memory_hits + self.durable_hits + self.logs_hits + self.not_found
        return round(self.memory_hits / asked, 4) if asked else None

    @property
    def unjoinable(self) -> int:
        return self.dropped_by_adapter + self.given_up + self.too_old + self.invalid_timestamp + self.capped

    def timed(self, phase: str, started: float) -> float:
        now = time.monotonic()
        self.phase_seconds[phase] = round(now - started, 3)
        return now


def staged_joins(outcomes: list[Path]) -> pa.Table:
    """Click and query times of the staged joined pairs, read from the Parquet files directly (no
    Spark job)."""
    staged = [ds.dataset(str(path), format="parquet") for path in outcomes if path.is_dir()]
    return ds.dataset(staged).to_table(columns=["timestamp_us", "query_timestamp_us"],
                                       filter=ds.field("outcome") == JOINED)


def join_delays(joins: pa.Table) -> dict[str, float]:
    """p50, p99 and max of click time minus query time."""
    delays = pc.subtract(joins["timestamp_us"], joins["query_timestamp_us"]).drop_null().to_numpy() / 1e6
    if not len(delays):
        return {}
    p50, p99 = np.percentile(delays, [50, 99])
    return {"p50": round(float(p50), 3), "p99": round(float(p99), 3), "max": round(float(delays.max()), 3)}


def output_latency(joins: pa.Table, committed_s: float) -> dict[str, float]:
    """p50 and p90 of the joined clicks' latency: from their event time to the output commit."""
    latency = committed_s - joins["timestamp_us"].to_numpy() / 1e6
    if not len(latency):
        return {}
    p50, p90 = np.percentile(latency, [50, 90])
    return {"p50": round(float(p50), 3), "p90": round(float(p90), 3)}


def window_advice(delay_seconds: dict[str, float], window_seconds: float) -> str | None:
    """One sentence on the join window (how long a click waits for its query before it is given
    up, `unjoinable_after_seconds`) against the delays seen: twice the largest delay would do."""
    if not delay_seconds or window_seconds <= 0:
        return None
    p99, largest = delay_seconds["p99"], delay_seconds["max"]
    said = f"p99 delay {p99:.0f} s is {p99 / window_seconds:.1%} of the {duration(window_seconds)} join window"
    if 2 * largest < window_seconds:
        return f"{said}: it could be cut to {duration(max(2 * largest, 60))} (twice the largest delay, {largest:.0f} s)"
    return f"{said}: the largest delay, {largest:.0f} s, is over half of it; keep it or widen it"


def duration(seconds: float) -> str:
    return f"{seconds / 3600:.3g} h" if seconds >= 3600 else f"{seconds / 60:.3g} min"


def click_columns(clicks: DataFrame) -> DataFrame:
    """The click fields as the output tables name them, the lookups made before (0 if none) and the
    work unit that made the last of them (pending clicks being retried)."""
    def carried(name: str, kind: str, default) -> Column:
        return (F.col(name) if name in clicks.columns else F.lit(default)).cast(kind).alias(name)

    return clicks.select(
        "click_id", "query_id", "timestamp_us", "ad_id", "advertiser_id", "cost_micros",
        (F.col("click_extra") if "click_extra" in clicks.columns else F.col("extra")).alias("click_extra"),
        carried("attempts", "int", 0), carried("last_attempt_unit", "string", None),
    )


def cap_clicks(spark: SparkSession, registry: IdRegistry, adapted: DataFrame, token: str, cap: int,
               staging: Path) -> tuple[DataFrame, DataFrame]:
    """The joined pairs within their query's grant from the registry (at most `cap` clicks per
    query over every work unit), and those past it. A query's earliest clicks, by
    (timestamp_us, click_id), are kept: every attempt of the unit, granted the same, keeps the same."""
    wanted = adapted.groupBy("query_id").agg(F.count("*").alias("wanted"))
    granted = grant_clicks(spark, registry, wanted, token, cap, staging / "grants")
    ranked = materialize(adapted.join(granted, "query_id").withColumn(
        "rank", F.row_number().over(Window.partitionBy("query_id").orderBy("timestamp_us", "click_id"))),
        staging / "ranked")
    within = ranked.where(F.col("rank") <= F.col("granted")).select(*adapted.columns)
    return within, ranked.where(F.col("rank") > F.col("granted")).select(*adapted.columns)


@dataclass(frozen=True)
class ClickPass:
    """One click run's pass over its work unit: what every step of the join needs and that is fixed
    for the pass, built once by the click pass (spark_ops/click_pass.py: fixed_for_the_pass) and
    handed down.
    `token`: the work unit's id, the registry token of its commits. `validity`: the timestamp rules
    (spark_ops/validity.py); None judges no timestamp. `max_clicks_per_query`: 0 caps nothing.
    `checkpoint(point)` is called at each of CRASH_POINTS (fault injection)."""

    spark: SparkSession
    registry: IdRegistry
    event_store: EventStore
    pending: PendingPolicy
    token: str
    attempt: int
    dc: str
    staging: Path
    tables: dict[str, str]
    adapter: Adapter = default_adapter
    checkpoint: Callable[[str], None] = lambda point: None
    validity: TimestampValidity | None = None
    max_clicks_per_query: int = 0


@dataclass
class JoinInput:
    """A work unit's clicks: new log lines' events, and the due pending clicks it retries (their
    `pending_clicks` records), either may be absent. `record`: the new lines' ledger append, which the
    join runs beside itself (spark_ops/beside.py) and waits for before its registry commit, so a
    unit's ledger rows are committed before any of its ids is registered, as when it was appended
    first: recovery re-injects a lost id from its ledger row."""

    clicks: DataFrame | None
    retried: DataFrame | None = None
    record: Callable[[], None] | None = None


def join_work_unit(unit: ClickPass, work: JoinInput) -> JoinStats:
    """One work unit's clicks joined exactly once (see the module docstring). The one owner of the
    ledger append (`work.record`): it starts it beside the join, the join waits for it before its
    registry commit, and a failed join still waits for it (the join's error is the one reported),
    so it never runs on after the join (it reads the staged lines removed here)."""
    unit.staging.mkdir(parents=True, exist_ok=True)
    recorded = None if work.record is None else beside(unit.spark, work.record, f"{unit.token}-ledger")
    try:
        stats = _join(unit, work, recorded)
    except BaseException:
        settle_quietly(recorded)
        raise
    else:
        settle(recorded)  # a run that returns has its ledger rows committed, or fails with the append's error
    finally:
        # After the ledger append, which reads the staged lines.
        unit.event_store.release()
        shutil.rmtree(unit.staging, ignore_errors=True)
    return stats


def _join(unit: ClickPass, work: JoinInput, recorded: Future | None) -> JoinStats:
    stats = JoinStats()
    mark = time.monotonic()
    staging = unit.staging
    resolve = partial(_resolve, unit, stats=stats)
    parts = [click_columns(df) for df in (work.clicks, work.retried) if df is not None]
    if not parts:
        return stats
    clicks = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
    looked = _looked(unit, clicks)
    mark = stats.timed("lookup_plan", mark)
    settle(recorded)
    mark = stats.timed("ledger_wait", mark)
    unit.checkpoint("before_registry_commit")
    outcomes = resolve(looked, None, staging / "outcomes")
    mark = stats.timed("lookup_judge_commit", mark)
    if stats.looked_up == 0:
        return stats
    if stats.beyond_memory:
        beyond = outcomes.where(F.col("state") == BEYOND_MEMORY)
        found = _find(beyond, unit.event_store, stats)
        outcomes = outcomes.where(F.col("state") != BEYOND_MEMORY).unionByName(
            resolve(beyond.select(*looked.columns), found, staging / "outcomes_beyond"))
        mark = stats.timed("eventstore", mark)
    joins = staged_joins([staging / "outcomes", staging / "outcomes_beyond"])
    stats.delay_seconds = join_delays(joins)
    unit.checkpoint("after_registry_commit")

    _write(unit, outcomes, work.retried, stats)
    stats.latency_seconds = output_latency(joins, time.time())
    mark = stats.timed("write", mark)
    unit.checkpoint("after_output_write")

    # Output durable: the registry need not keep this token any more.
    unit.registry.clear_tokens(unit.token)
    stats.timed("clear_tokens", mark)
    unit.checkpoint("after_clear_tokens")
    return stats


def _looked(unit: ClickPass, clicks: DataFrame) -> DataFrame:
    """The clicks, one row per click_id, with their registry entry, their query's line and time when
    the memory tier holds it, and their `state` (see STATES). A miss is conclusive above the memory
    tier's horizon, read by each task after its lookups (a later eviction only raises it)."""
    spark, store, validity = unit.spark, unit.event_store, unit.validity
    # This run's values (the clock, the stream's progress) as columns, not literals: the code Spark
    # generates for the job's stages stays the same from run to run (spark_ops/schemas.py).
    run_values = {**unit.pending.run_values(), **({} if validity is None else validity.run_values())}
    looked = lookup_clicks(spark, unit.registry, clicks.dropDuplicates(["click_id"]), unit.dc, store,
                           unit.staging / "lookup", RunColumns(unit.pending.progress_table(), run_values))
    looked = looked.withColumn("query_ts", event_id_parts("query_id")[2])
    status, line, horizon = F.col("registry_status"), F.col("line"), F.col("memory_horizon_ts")
    taken = (status == "registered") & (F.col("registry_token").isNull() | (F.col("registry_token") != unit.token))
    future = F.lit(False) if validity is None else validity.from_future(F.col("timestamp_us"))
    ingested = F.coalesce(F.col("writer_ts") >= F.col("query_ts"), F.lit(False))
    # What the memory tier was fed up to: by a query tailer, the writer's time it put; by query runs
    # (no tailer), the writer's ingested progress, since a query run puts before it records that.
    fed = F.coalesce(F.col("query_fed_ts") >= F.col("query_ts"), ingested)
    vouched = horizon.isNotNull() & (F.col("query_ts") > horizon)
    state = (
        F.when(taken, TAKEN).when(status == "too_old", TOO_OLD).when(future, FUTURE)
        .when(line.isNotNull(), IN_MEMORY).when(fed & vouched, NOT_HELD).when(fed | ingested, BEYOND_MEMORY)
        .otherwise(NOT_INGESTED)
    )
    # A miss the memory tier vouched for was looked up as of the writer's fed time: a retry before that
    # writer logs past it, or backfills, would miss again (spark_ops/pending.py, writer_ts_at_attempt).
    vouched_ts = F.when(state == NOT_HELD, F.col("query_fed_ts")).cast("long").alias("memory_vouched_ts")
    return looked.select("*", state.alias("state"), vouched_ts).drop(
        "query_ts", "registry_status", "registry_token", "memory_horizon_ts", "query_fed_ts", LATEST_VALID)


def _find(beyond: DataFrame, event_store: EventStore, stats: JoinStats) -> DataFrame:
    """The lines (click_id, query_timestamp_us, line) of the queries of misses beyond the memory
    tier's horizon that the durable and logs tiers hold."""
    found = event_store.beyond_memory(beyond.select("click_id", "query_id"))
    tiers = event_store.stats
    stats.durable_hits, stats.logs_hits = tiers.durable_hits, tiers.logs_hits
    stats.logs_ranges_read, stats.logs_bytes_read = tiers.logs_ranges_read, tiers.logs_bytes_read
    stats.not_found -= stats.durable_hits + stats.logs_hits
    return found


def _judged(unit: ClickPass, looked: DataFrame, found: DataFrame | None) -> DataFrame:
    """Each click with its `outcome` (joined, invalid timestamp, given up or pending, for the judged
    states; null for the others), its `reason`, and the record it leaves if still pending. The query
    is judged by its time; its line is parsed only for the output. `found`: lines of misses beyond
    the memory tier that the other tiers found."""
    rows = looked
    if found is not None:
        rows = (rows.join(found.withColumnRenamed("line", "found_line")
                          .withColumnRenamed("query_timestamp_us", "found_ts"), "click_id", "left")
                .withColumn("line", F.coalesce("line", "found_line"))
                .withColumn("query_timestamp_us", F.coalesce("query_timestamp_us", "found_ts"))
                .withColumn("state", F.when(F.col("line").isNotNull(), IN_MEMORY).otherwise(NOT_HELD))
                .drop("found_line", "found_ts"))
    rows = unit.pending.judge(
        rows.select(*CLICK_FIELDS, "attempts", "last_attempt_unit", "state", "query_timestamp_us", "line",
                    "memory_vouched_ts", "query_writer", "writer_ts", "writer_backfills", STREAM_PROGRESS), unit.token)
    state, has_query = F.col("state"), F.col("line").isNotNull()
    early = (F.lit(False) if unit.validity is None
             else unit.validity.before_query(F.col("timestamp_us"), F.col("query_timestamp_us")))
    judged = state.isin(*JUDGED_STATES)
    outcome = (F.when(~judged, F.lit(None)).when(state == FUTURE, INVALID).when(has_query & early, INVALID)
               .when(has_query, JOINED).when(F.col("give_up"), GIVEN_UP).otherwise(PENDING))
    reason = (F.when(state == FUTURE, FUTURE_REASON).when(has_query & early, BEFORE_QUERY_REASON)
              .when(has_query, F.lit(None)).when(judged & F.col("give_up"), F.col("reason")))
    return rows.withColumn("outcome", outcome).withColumn("reason", reason).drop("give_up")


def _refined(unit: ClickPass, judged: DataFrame, staging: Path) -> DataFrame:
    """The joined pairs, as (click, query) rows, through the adapter (business logic that may alter or
    drop rows: dropped ones are unjoinable) and the per-query cap (resources/registry/click_caps.py: those past
    their query's grant are unjoinable as capped); the other rows as they were."""
    def outcome(df: DataFrame, name: str, reason: str | None = None) -> DataFrame:
        return (df.withColumn("outcome", F.lit(name)).withColumn("reason", F.lit(reason).cast("string"))
                .withColumn("state", F.lit(IN_MEMORY)))

    is_joined = F.coalesce(F.col("outcome") == JOINED, F.lit(False))
    joined = judged.where(is_joined)
    schema = TABLE_SCHEMAS["joined_clicks"][0]
    pairs = with_query_struct(joined.select(*CLICK_FIELDS, "line"))
    adapted = unit.adapter(pairs).select(*[c for c in schema.fieldNames() if c in pairs.columns])
    parts = [judged.where(~is_joined)]
    if unit.adapter is not default_adapter:
        adapted = materialize(adapted, staging / "adapted")
        dropped = joined.join(adapted.select("click_id"), "click_id", "left_anti").select(*CLICK_FIELDS)
        parts.append(outcome(dropped, DROPPED, DROPPED_REASON))
    if unit.max_clicks_per_query > 0:
        adapted, capped = cap_clicks(unit.spark, unit.registry, adapted, unit.token, unit.max_clicks_per_query, staging)
        parts.append(outcome(capped.select(*CLICK_FIELDS), CAPPED, CAPPED_REASON))
    # The query's time goes along for the window advice (join_delays), whatever the adapter kept.
    adapted = adapted.join(joined.select("click_id", "query_timestamp_us"), "click_id")
    parts.append(outcome(adapted, JOINED))
    refined = parts[0]
    for part in parts[1:]:
        refined = refined.unionByName(part, allowMissingColumns=True)
    return refined


def _resolve(unit: ClickPass, looked: DataFrame, found: DataFrame | None, path: Path, *, stats: JoinStats) -> DataFrame:
    """Judges the looked-up clicks (`_judged`; `_refined` too when an adapter or a cap is set) and
    registers every id this work unit resolves with its token (the others are left pending or
    skipped), in one Spark job writing the outcomes, with their registry `status`, to `path`. The
    counts of the states, outcomes and answers are observed meanwhile and added to `stats`."""
    judged = _judged(unit, looked, found)
    if unit.adapter is not default_adapter or unit.max_clicks_per_query > 0:
        judged = _refined(unit, materialize(judged, path.with_name(path.name + "_judged")), path.parent)
    resolved = F.coalesce(F.col("outcome") != PENDING, F.lit(False))
    committed = commit_ids(unit.spark, unit.registry, judged.withColumn("resolved", resolved), unit.token,
                           path.with_name(path.name + "_commit"), where="resolved").drop("resolved")
    state, outcome, status = F.col("state"), F.col("outcome"), F.col("status")
    counts = {name: F.count_if(state == name) for name in STATES}
    counts.update({name: F.count_if((outcome == name) & (status == "held")) for name in (JOINED, *UNJOINABLE_OUTCOMES)})
    outcomes, counted = materialize_counted(
        committed, path, **counts, pending_outcome=F.count_if(outcome == PENDING),
        refused=F.count_if(status == "refused"), too_old_answer=F.count_if(status == "too_old"))
    if found is None:  # the first call: the states of every click
        stats.looked_up = sum(counted[name] for name in STATES)
        stats.skipped_registered, stats.too_old = counted[TAKEN], counted[TOO_OLD]
        stats.memory_hits, stats.not_ingested_yet = counted[IN_MEMORY], counted[NOT_INGESTED]
        stats.not_found = counted[NOT_HELD] + counted[BEYOND_MEMORY] + counted[NOT_INGESTED]
        stats.beyond_memory = counted[BEYOND_MEMORY]
    stats.joined += counted[JOINED]
    stats.pending += counted["pending_outcome"]
    stats.refused += counted["refused"]
    stats.dropped_by_adapter += counted[DROPPED]
    stats.given_up += counted[GIVEN_UP]
    stats.invalid_timestamp += counted[INVALID]
    stats.capped += counted[CAPPED]
    stats.too_old += counted["too_old_answer"]
    return outcomes


def _write(unit: ClickPass, outcomes: DataFrame, retried: DataFrame | None, stats: JoinStats) -> None:
    """The outputs, keyed by click_id, and the pending clicks' records, side by side (each a Delta
    commit of its own table; `side_by_side`). With retried pending clicks, their records go last, once
    the outputs are durable: written first, a crash before the outputs would leave those clicks
    registered to this token with no output, and a retry of the unit would not retry them (their
    records say resolved). A table with nothing to add is not touched: an empty commit still costs a
    Delta commit."""
    token, dc, tables = unit.token, unit.dc, unit.tables
    outcome, held = F.col("outcome"), F.col("status") == "held"
    # The time the registry decided the click (spark_ops/registry_calls.py: commit_ids), not
    # current_timestamp(): Spark folds that into a literal of the code it generates, new at every run.
    now = F.timestamp_micros(F.col("decided_at_us"))
    writes = []
    if stats.joined:
        schema = TABLE_SCHEMAS["joined_clicks"][0]
        joined = outcomes.where((outcome == JOINED) & held)
        # The query's line parsed into the output's `query` here, unless the adapter already made it.
        if "query" not in joined.columns:
            joined = with_query_struct(joined.select(*CLICK_FIELDS, "line", "decided_at_us"))
        rows = joined.select(*[c for c in schema.fieldNames() if c in joined.columns],
                             F.lit(dc).alias("joined_by_dc"), now.alias("joined_at"), F.lit(token).alias("work_unit"))
        writes.append(partial(write_output, rows, "joined_clicks", tables["joined_clicks"], "click_id", token, unit.attempt))
    if stats.unjoinable:
        too_old = (F.col("state") == TOO_OLD) | (F.col("status") == "too_old")
        rows = (
            outcomes.where((outcome.isin(*UNJOINABLE_OUTCOMES) & held) | too_old)
            .select(*CLICK_FIELDS, F.when(too_old, TOO_OLD_REASON).otherwise(F.col("reason")).alias("reason"),
                    F.lit(dc).alias("dc"), now.alias("recorded_at"), F.lit(token).alias("work_unit"))
        )
        writes.append(partial(write_output, rows, "unjoinable_clicks", tables["unjoinable_clicks"], "click_id", token,
                              unit.attempt))
    records = None
    if stats.pending or retried is not None:
        # Each retried click has its outcome: it was looked up with the unit's clicks.
        resolved = None if retried is None else retried.join(
            outcomes.where(~F.coalesce(outcome == PENDING, F.lit(False))).select("click_id", "decided_at_us"), "click_id")
        records = partial(record_pending, tables["pending_clicks"], dc, outcomes.where(outcome == PENDING), resolved)
    if records is not None and retried is None:
        writes.append(records)
        records = None
    side_by_side(unit.spark, writes, f"{token}-write")
    if records is not None:
        records()
