"""The joiner (Photon §3.3) as a Spark micro-batch: look up, adapt, register, write.

One call processes one work unit's clicks in five phases. Each computes what it needs once, into
the unit's staging directory, with the counts the pass reports observed while it is written: a pass
costs a Spark job per phase, not per question asked of its data.
1. lookup: the clicks, deduplicated, with what one call per partition to the registry service
   answers: their registry entry (the dispatcher lookup: a click registered under another token is
   skipped; one older than the registry's GC boundary is unjoinable, too old) and their query's
   line if the EventStore's memory tier holds it;
2. find: the memory tier's hits and, for its inconclusive misses only, the durable and logs tiers'
   (spark_ops/event_store.py); the query events parsed from their lines;
3. judge: each click's outcome: joined (after the adapter, business logic over (click, query) pairs
   that may alter or drop rows, and the per-query cap: resources/click_caps.py), dropped by the
   adapter, invalid timestamp (spark_ops/validity.py), capped, given up, or still pending
   (spark_ops/pending.py);
4. commit: every id this work unit resolves, conditionally registered with its token;
5. write: the winners appended to `joined_clicks` / `unjoinable_clicks` (merged on `click_id` by a
   retry: spark_ops/tables.py), then the pending clicks' records; once that output is durable,
   the token is cleared.
A crash anywhere leaves a state from which the same work unit, retried, produces exactly the
output a clean run would have (see tests/spark_ops/test_join.py for each crash point).
"""

from __future__ import annotations

import importlib
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from resources.registry import IdRegistry
from spark_ops.event_store import EventStore, event_id_parts
from spark_ops.handoff import materialize, materialize_counted
from spark_ops.parse import with_query_struct
from spark_ops.pending import PendingPolicy, record_pending
from spark_ops.registry_calls import commit_ids, grant_clicks, lookup_clicks
from spark_ops.tables import CLICK_EVENT, TABLE_SCHEMAS, write_output
from spark_ops.validity import BEFORE_QUERY_REASON, FUTURE_REASON, TimestampValidity

Adapter = Callable[[DataFrame], DataFrame]

# Points between the join's side effects where a crash must leave a retryable state.
CRASH_POINTS = ("before_registry_commit", "after_registry_commit", "after_output_write")


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
# What a click is after the lookup (phase 1), and after the judgement (phase 3).
STATES = TAKEN, TOO_OLD, FUTURE, IN_MEMORY, MISS, NOT_INGESTED = (
    "taken", "too_old", "future", "in_memory", "miss", "not_ingested")
JOINED, DROPPED, GIVEN_UP, INVALID, CAPPED, PENDING = "joined", "dropped", "given_up", "invalid", "capped", "pending"
UNJOINABLE_OUTCOMES = (DROPPED, GIVEN_UP, INVALID, CAPPED)
# JoinStats counts that are the EventStore's (reported as eventstore_*).
EVENT_STORE_COUNTS = ("memory_hits", "durable_hits", "logs_hits", "not_found", "not_ingested_yet", "logs_ranges_read",
                      "logs_bytes_read")


@dataclass
class JoinStats:
    clicks: int = 0
    skipped_registered: int = 0
    memory_hits: int = 0
    durable_hits: int = 0
    logs_hits: int = 0
    not_found: int = 0
    not_ingested_yet: int = 0
    logs_ranges_read: int = 0
    logs_bytes_read: int = 0
    pending: int = 0
    joined: int = 0
    dropped_by_adapter: int = 0
    given_up: int = 0  # pending too long: recorded as unjoinable
    too_old: int = 0  # older than the registry's GC boundary: recorded as unjoinable
    invalid_timestamp: int = 0  # from the future, or before its query: recorded as unjoinable
    capped: int = 0  # past its query's click cap: recorded as unjoinable
    refused: int = 0  # wasted joins: joined here, refused by the registry
    phase_seconds: dict[str, float] = field(default_factory=dict)
    # Click time minus query time of the clicks joined (window advice, Facebook §6.5): p50, p99, max.
    delay_seconds: dict[str, float] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return {k: v for k, v in asdict(self).items() if k not in ("phase_seconds", "delay_seconds")}

    @property
    def memory_hit_ratio(self) -> float | None:
        looked_up = self.memory_hits + self.durable_hits + self.logs_hits + self.not_found
        return round(self.memory_hits / looked_up, 4) if looked_up else None

    @property
    def unjoinable(self) -> int:
        return self.dropped_by_adapter + self.given_up + self.too_old + self.invalid_timestamp + self.capped

    def timed(self, phase: str, started: float) -> float:
        now = time.monotonic()
        self.phase_seconds[phase] = round(now - started, 3)
        return now


def join_delays(outcomes: Path) -> dict[str, float]:
    """p50, p99 and max of click time minus query time over the staged joined pairs, read from the
    Parquet files directly (no Spark job); empty if the adapter dropped the query's time."""
    try:
        table = ds.dataset(str(outcomes), format="parquet").to_table(
            columns={"click_us": ds.field("timestamp_us"), "query_us": ds.field("query", "timestamp_us")},
            filter=ds.field("outcome") == JOINED)
    except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError):
        return {}
    delays = pc.subtract(table["click_us"], table["query_us"]).drop_null().to_numpy() / 1e6
    if not len(delays):
        return {}
    p50, p99 = np.percentile(delays, [50, 99])
    return {"p50": round(float(p50), 3), "p99": round(float(p99), 3), "max": round(float(delays.max()), 3)}


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


@dataclass
class JoinInput:
    """A work unit's clicks: new log lines' events, and the due pending clicks it retries (their
    `pending_clicks` records), either may be absent."""

    clicks: DataFrame | None
    retried: DataFrame | None = None


def join_work_unit(
    spark: SparkSession,
    work: JoinInput,
    event_store: EventStore,
    registry: IdRegistry,
    token: str,
    attempt: int,
    dc: str,
    staging: Path,
    tables: dict[str, str],
    pending: PendingPolicy,
    adapter: Adapter = default_adapter,
    checkpoint: Callable[[str], None] = lambda point: None,
    validity: TimestampValidity | None = None,
    max_clicks_per_query: int = 0,
) -> JoinStats:
    """One work unit's clicks joined exactly once (see the module docstring). `validity`: the
    timestamp rules (spark_ops/validity.py); None judges no timestamp. `max_clicks_per_query`: 0
    caps nothing."""
    stats = JoinStats()
    mark = time.monotonic()
    staging.mkdir(parents=True, exist_ok=True)
    try:
        retried = None if work.retried is None else materialize(work.retried, staging / "retried")
        parts = [click_columns(df) for df in (work.clicks, retried) if df is not None]
        clicks = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
        looked, seen = _lookup(spark, clicks, registry, token, dc, pending, validity, staging)
        stats.clicks = sum(seen[state] for state in STATES)
        stats.skipped_registered, stats.too_old = seen[TAKEN], seen[TOO_OLD]
        mark = stats.timed("lookup", mark)
        if stats.clicks == 0:
            return stats

        found, not_found = _find(looked, seen, event_store, registry.queries_horizon(dc), stats, staging)
        mark = stats.timed("eventstore", mark)

        outcomes, judged = _judge(spark, found, not_found, looked, registry, token, pending, adapter, validity,
                                  max_clicks_per_query, staging)
        stats.pending = judged[PENDING]
        stats.delay_seconds = join_delays(staging / "outcomes")
        mark = stats.timed("judge", mark)

        checkpoint("before_registry_commit")
        answers = _commit(spark, registry, outcomes, token, staging, stats)
        mark = stats.timed("registry_commit", mark)
        checkpoint("after_registry_commit")

        _write(outcomes, answers, looked, retried, stats, token, attempt, dc, tables)
        mark = stats.timed("write", mark)
        checkpoint("after_output_write")

        # Output durable: the registry need not keep this token any more.
        registry.clear_tokens(token)
        stats.timed("clear_tokens", mark)
        return stats
    finally:
        event_store.release()
        shutil.rmtree(staging, ignore_errors=True)


def _lookup(spark: SparkSession, clicks: DataFrame, registry: IdRegistry, token: str, dc: str, pending: PendingPolicy,
            validity: TimestampValidity | None, staging: Path) -> tuple[DataFrame, dict]:
    """Phase 1: the clicks, one row per click_id, with their registry entry, their query's line when
    the memory tier holds it, and their `state`; the count of each state, and the oldest query time
    of the misses (an inconclusive miss is one at or before the memory tier's horizon)."""
    looked = lookup_clicks(spark, registry, clicks.dropDuplicates(["click_id"]), dc, staging / "lookup")
    ip, pid, query_ts = event_id_parts("query_id")
    looked = (
        looked.withColumn("query_writer", F.concat_ws(":", ip, pid))
        .withColumn("query_ts", query_ts)
        .join(F.broadcast(pending.progress_frame(spark).select("query_writer", "writer_ts")), "query_writer", "left")
    )
    status, line = F.col("registry_status"), F.col("line")
    taken = (status == "registered") & (F.col("registry_token").isNull() | (F.col("registry_token") != token))
    future = F.lit(False) if validity is None else validity.from_future(F.col("timestamp_us"))
    ingested = F.coalesce(F.col("writer_ts") >= F.col("query_ts"), F.lit(False))
    state = (
        F.when(taken, TAKEN).when(status == "too_old", TOO_OLD).when(future, FUTURE)
        .when(line.isNotNull(), IN_MEMORY).when(ingested, MISS).otherwise(NOT_INGESTED)
    )
    looked = looked.withColumn("state", state).drop("query_writer", "writer_ts", "registry_status", "registry_token")
    counts = {name: F.count_if(F.col("state") == name) for name in STATES}
    return materialize_counted(looked, staging / "looked", **counts,
                               oldest_miss_ts=F.min(F.when(F.col("state") == MISS, F.col("query_ts"))))


def _find(looked: DataFrame, seen: dict, event_store: EventStore, horizon_ts: int | None, stats: JoinStats,
          staging: Path) -> tuple[DataFrame, DataFrame]:
    """Phase 2: the clicks whose query was found, with their query event (`query`), materialized;
    and the candidates not found. The durable and logs tiers are read only for misses at or before
    the memory tier's horizon, read after the lookups (a later eviction only raises it)."""
    state = F.col("state")
    lines = looked.where(state == IN_MEMORY)
    missing = looked.where(state.isin(MISS, NOT_INGESTED))
    stats.memory_hits, stats.not_ingested_yet = seen[IN_MEMORY], seen[NOT_INGESTED]
    conclusive = horizon_ts is not None and (seen[MISS] == 0 or seen["oldest_miss_ts"] > horizon_ts)
    if not conclusive:
        beyond = missing.where((state == MISS) & (F.lit(horizon_ts is None) | (F.col("query_ts") <= F.lit(horizon_ts or 0))))
        answered = event_store.beyond_memory(beyond.select("click_id", "query_id"))
        stats.durable_hits, stats.logs_hits = event_store.stats.durable_hits, event_store.stats.logs_hits
        stats.logs_ranges_read, stats.logs_bytes_read = event_store.stats.logs_ranges_read, event_store.stats.logs_bytes_read
        lines = lines.unionByName(missing.drop("line").join(answered, "click_id"))
        missing = missing.join(answered.select("click_id"), "click_id", "left_anti")
    stats.not_found = seen[MISS] + seen[NOT_INGESTED] - stats.durable_hits - stats.logs_hits
    found = materialize(with_query_struct(lines.select(*CLICK_FIELDS, "attempts", "line")), staging / "found")
    return found, missing


def _judge(spark: SparkSession, found: DataFrame, not_found: DataFrame, looked: DataFrame, registry: IdRegistry,
           token: str, pending: PendingPolicy, adapter: Adapter, validity: TimestampValidity | None,
           max_clicks_per_query: int, staging: Path) -> tuple[DataFrame, dict]:
    """Phase 3: one row per click the unit resolves or leaves pending, with its `outcome` (and
    `reason`), materialized; the count of each outcome."""
    def outcome(df: DataFrame, name: str, reason: Column | None = None) -> DataFrame:
        return df.withColumn("outcome", F.lit(name)).withColumn("reason", F.lit(None).cast("string") if reason is None else reason)

    parts = []
    if validity is not None:
        early = validity.before_query(F.col("timestamp_us"), F.col("query.timestamp_us"))
        parts.append(outcome(found.where(early).select(*CLICK_FIELDS), INVALID, F.lit(BEFORE_QUERY_REASON)))
        parts.append(outcome(looked.where(F.col("state") == FUTURE).select(*CLICK_FIELDS), INVALID, F.lit(FUTURE_REASON)))
        found = found.where(~early)
    schema = TABLE_SCHEMAS["joined_clicks"][0]
    adapted = adapter(found.drop("attempts")).select(*[c for c in schema.fieldNames() if c in found.columns])
    if adapter is not default_adapter:
        adapted = materialize(adapted, staging / "adapted")
        dropped = found.join(adapted.select("click_id"), "click_id", "left_anti").select(*CLICK_FIELDS)
        parts.append(outcome(dropped, DROPPED, F.lit(DROPPED_REASON)))
    if max_clicks_per_query > 0:
        adapted, capped = cap_clicks(spark, registry, adapted, token, max_clicks_per_query, staging)
        parts.append(outcome(capped.select(*CLICK_FIELDS), CAPPED, F.lit(CAPPED_REASON)))
    parts.append(outcome(adapted, JOINED))
    judged = pending.judge(not_found.select(*CLICK_FIELDS, "attempts", "last_attempt_unit"), token)
    parts.append(judged.where("give_up").drop("give_up").withColumn("outcome", F.lit(GIVEN_UP)))
    parts.append(judged.where(~F.col("give_up")).drop("give_up", "reason").withColumn("outcome", F.lit(PENDING))
                 .withColumn("reason", F.lit(None).cast("string")))
    outcomes = parts[0]
    for part in parts[1:]:
        outcomes = outcomes.unionByName(part, allowMissingColumns=True)
    return materialize_counted(outcomes, staging / "outcomes",
                               **{name: F.count_if(F.col("outcome") == name) for name in (JOINED, PENDING)})


def _commit(spark: SparkSession, registry: IdRegistry, outcomes: DataFrame, token: str, staging: Path,
            stats: JoinStats) -> DataFrame:
    """Phase 4: every resolved id registered with the token; the answers (click_id, outcome, status)."""
    resolved = outcomes.where(F.col("outcome") != PENDING).select("click_id", "timestamp_us", "outcome")
    answers = commit_ids(spark, registry, resolved, token, staging / "commit")
    counted = {(r["outcome"], r["status"]): r["count"] for r in answers.groupBy("outcome", "status").count().collect()}

    def count(outcome: str | None = None, status: str | None = None) -> int:
        return sum(n for (o, s), n in counted.items() if outcome in (None, o) and status in (None, s))

    stats.joined = count(JOINED, "held")
    stats.dropped_by_adapter = count(DROPPED, "held")
    stats.given_up = count(GIVEN_UP, "held")
    stats.invalid_timestamp = count(INVALID, "held")
    stats.capped = count(CAPPED, "held")
    stats.refused = count(status="refused")
    stats.too_old += count(status="too_old")
    return answers


def _write(outcomes: DataFrame, answers: DataFrame, looked: DataFrame, retried: DataFrame | None, stats: JoinStats,
           token: str, attempt: int, dc: str, tables: dict[str, str]) -> None:
    """Phase 5: the outputs, keyed by click_id, then the pending clicks' records (last: a retry of a
    unit that crashed before them retries the same pending clicks). A table with nothing to add is
    not touched: an empty commit still costs a Delta commit."""
    now = F.current_timestamp()
    held = answers.where(F.col("status") == "held").select("click_id")
    if stats.joined:
        schema = TABLE_SCHEMAS["joined_clicks"][0]
        joined = outcomes.where(F.col("outcome") == JOINED).join(held, "click_id", "left_semi")
        rows = joined.select(*[c for c in schema.fieldNames() if c in joined.columns],
                             F.lit(dc).alias("joined_by_dc"), now.alias("joined_at"), F.lit(token).alias("work_unit"))
        write_output(rows, "joined_clicks", tables["joined_clicks"], "click_id", token, attempt)
    if stats.unjoinable:
        too_old = answers.where(F.col("status") == "too_old").select("click_id").unionByName(
            looked.where(F.col("state") == TOO_OLD).select("click_id"))
        rows = (
            outcomes.where(F.col("outcome").isin(*UNJOINABLE_OUTCOMES)).join(held, "click_id", "left_semi")
            .select(*CLICK_FIELDS, "reason")
            .unionByName(looked.join(too_old, "click_id", "left_semi").select(*CLICK_FIELDS, F.lit(TOO_OLD_REASON).alias("reason")))
            .select("*", F.lit(dc).alias("dc"), now.alias("recorded_at"), F.lit(token).alias("work_unit"))
        )
        write_output(rows, "unjoinable_clicks", tables["unjoinable_clicks"], "click_id", token, attempt)
    if stats.pending or retried is not None:
        still = outcomes.where(F.col("outcome") == PENDING)
        record_pending(tables["pending_clicks"], dc, still, retried)
