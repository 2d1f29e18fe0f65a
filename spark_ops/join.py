"""The joiner (Photon §3.3) as a Spark micro-batch: look up, adapt, register, write.

One call processes one work unit's clicks:
1. dispatcher lookup: clicks already registered under another token are skipped (joined elsewhere);
   ids registered under *this* token are kept (a retry of this work unit gets its own ids back);
   ids older than the registry's GC boundary are resolved as unjoinable (too old);
2. EventStore lookup (spark_ops/event_store.py): each click's query, from the cache tier or through
   the log file map in the raw logs; clicks without one stay pending or, past the unjoinable age,
   are given up (spark_ops/pending.py);
   clicks with an absurd timestamp (from the future, or before their query) are resolved as
   unjoinable at once (spark_ops/validity.py);
3. adapter: business logic over (click, query) pairs; it may alter or drop rows; then the
   per-query cap, when set: clicks of a query past its grant from the registry are unjoinable as
   capped (Facebook §6.6, resources/click_caps.py);
4. conditional commit of the surviving ids (and of dropped and given-up ones, recorded as
   unjoinable) with the work unit's token;
5. the winners are written to `joined_clicks` / `unjoinable_clicks` (appended by a first attempt,
   merged on `click_id` by a retry: spark_ops/tables.py), and `pending_clicks` records what is still
   pending;
6. once that output is durable, the token is cleared on its ids.
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
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from resources.registry import IdRegistry
from spark_ops.event_store import EventStore
from spark_ops.handoff import materialize
from spark_ops.pending import PendingPolicy, update_pending
from spark_ops.registry_calls import commit_ids, grant_clicks, lookup_ids
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


@dataclass
class JoinStats:
    clicks: int = 0
    skipped_registered: int = 0
    cache_hits: int = 0
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

    def timed(self, phase: str, started: float) -> float:
        now = time.monotonic()
        self.phase_seconds[phase] = round(now - started, 3)
        return now


def labelled(df: DataFrame, outcome: str, status: str | None) -> DataFrame:
    """One (outcome, registry status) row per row of `df`, for counting."""
    return df.select(F.lit(outcome).alias("outcome"), F.lit(status).cast("string").alias("status"))


def join_delays(adapted: Path) -> dict[str, float]:
    """p50, p99 and max of click time minus query time over the staged joined pairs, read from the
    Parquet files directly (no Spark job); empty if the adapter dropped the query's time."""
    try:
        table = ds.dataset(str(adapted), format="parquet").to_table(
            columns={"click_us": ds.field("timestamp_us"), "query_us": ds.field("query", "timestamp_us")})
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


def cap_clicks(spark: SparkSession, registry: IdRegistry, adapted: DataFrame, token: str, cap: int,
               staging: Path) -> tuple[DataFrame, DataFrame]:
    """The joined pairs within their query's grant from the registry (at most `cap` clicks per
    query over every work unit), and the click_ids past it. A query's earliest clicks, by
    (timestamp_us, click_id), are kept: every attempt of the unit, granted the same, keeps the same."""
    wanted = adapted.groupBy("query_id").agg(F.count("*").alias("wanted"))
    granted = grant_clicks(spark, registry, wanted, token, cap, staging / "grants")
    ranked = adapted.join(granted, "query_id").withColumn(
        "rank", F.row_number().over(Window.partitionBy("query_id").orderBy("timestamp_us", "click_id")))
    within = materialize(ranked.where(F.col("rank") <= F.col("granted")).select(*adapted.columns), staging / "within_cap")
    return within, ranked.where(F.col("rank") > F.col("granted")).select("click_id")


def click_columns(clicks: DataFrame) -> DataFrame:
    """The click fields as the output tables name them, and the lookups made before (0 if none)."""
    attempts = F.col("attempts") if "attempts" in clicks.columns else F.lit(0)
    return clicks.select(
        "click_id", "query_id", "timestamp_us", "ad_id", "advertiser_id", "cost_micros",
        (F.col("click_extra") if "click_extra" in clicks.columns else F.col("extra")).alias("click_extra"),
        attempts.cast("int").alias("attempts"),
    )


def join_work_unit(
    spark: SparkSession,
    clicks: DataFrame,
    event_store: EventStore,
    registry: IdRegistry,
    token: str,
    attempt: int,
    dc: str,
    staging: Path,
    tables: dict[str, str],
    pending: PendingPolicy,
    retrying_pending: bool = False,
    adapter: Adapter = default_adapter,
    checkpoint: Callable[[str], None] = lambda point: None,
    validity: TimestampValidity | None = None,
    max_clicks_per_query: int = 0,
) -> JoinStats:
    """`clicks`: parsed click events (any duplicates), pending clicks being retried, or both
    (`retrying_pending`; pending clicks carry their `attempts`). `validity`: the timestamp rules
    (spark_ops/validity.py); None judges no timestamp. `max_clicks_per_query`: 0 caps nothing."""
    stats = JoinStats()
    mark = time.monotonic()
    staging.mkdir(parents=True, exist_ok=True)
    click_fields = [f.name for f in CLICK_EVENT]

    try:
        # Every intermediate result is computed once, into the work unit's staging directory: the
        # counts and the MERGEs below read files, never re-run a lookup (spark_ops/handoff.py).
        clicks = materialize(click_columns(clicks).dropDuplicates(["click_id"]), staging / "clicks")
        stats.clicks = clicks.count()
        mark = stats.timed("dedupe", mark)
        if stats.clicks == 0:
            return stats

        # 1. Dispatcher lookup.
        registered = lookup_ids(spark, registry, clicks.select("click_id", "timestamp_us"), staging / "lookup")
        taken = registered.where(
            (F.col("status") == "registered") & (F.col("token").isNull() | (F.col("token") != token))
        ).select("click_id")
        too_old_seen = registered.where(F.col("status") == "too_old").select("click_id")
        candidates = clicks.join(taken.unionByName(too_old_seen), "click_id", "left_anti")
        invalid = []  # clicks with an absurd timestamp, with their reason
        if validity is not None:
            future = validity.from_future(F.col("timestamp_us"))
            invalid.append(candidates.where(future).select(*click_fields, F.lit(FUTURE_REASON).alias("reason")))
            candidates = candidates.where(~future)
        mark = stats.timed("lookup", mark)

        # 2. EventStore lookup; what neither tier has is judged by the pending policy.
        found, not_found = event_store.lookup(candidates)
        if validity is not None:
            early = validity.before_query(F.col("timestamp_us"), F.col("query.timestamp_us"))
            invalid.append(found.where(early).select(*click_fields, F.lit(BEFORE_QUERY_REASON).alias("reason")))
            found = found.where(~early)
        judged = materialize(pending.judge(not_found, token), staging / "judged")
        mark = stats.timed("eventstore", mark)

        # 3. Adapter. Clicks it drops are resolved as unjoinable, through the registry like joins.
        schema = TABLE_SCHEMAS["joined_clicks"][0]
        adapted = materialize(
            adapter(found).select(*[c for c in schema.fieldNames() if c in found.columns]), staging / "adapted"
        )
        dropped = (
            found.join(adapted.select("click_id"), "click_id", "left_anti")
            .select(*click_fields, F.lit("dropped by adapter").alias("reason"), F.lit("dropped").alias("outcome"))
        )
        still_pending = judged.where(~F.col("give_up"))
        given_up = judged.where("give_up").select(*click_fields, "reason", F.lit("given_up").alias("outcome"))
        unjoinable = dropped.unionByName(given_up)
        joined_pairs = staging / "adapted"
        if max_clicks_per_query > 0:
            adapted, capped = cap_clicks(spark, registry, adapted, token, max_clicks_per_query, staging)
            joined_pairs = staging / "within_cap"
            unjoinable = unjoinable.unionByName(
                found.join(capped, "click_id", "left_semi")
                .select(*click_fields, F.lit(CAPPED_REASON).alias("reason"), F.lit("capped").alias("outcome")))
        for part in invalid:
            unjoinable = unjoinable.unionByName(part.select("*", F.lit("invalid").alias("outcome")))
        unjoinable = materialize(unjoinable, staging / "unjoinable")
        stats.delay_seconds = join_delays(joined_pairs)
        mark = stats.timed("adapter", mark)

        # 4. Conditional commit of every id this work unit resolves.
        checkpoint("before_registry_commit")
        resolved = adapted.select("click_id", "timestamp_us").unionByName(unjoinable.select("click_id", "timestamp_us"))
        answers = commit_ids(spark, registry, resolved, token, staging / "commit")
        winners = answers.where(F.col("status") == "held").select("click_id")
        too_old = answers.where(F.col("status") == "too_old").select("click_id").unionByName(too_old_seen)
        mark = stats.timed("registry_commit", mark)
        checkpoint("after_registry_commit")

        for name, value in event_store.stats.as_dict().items():
            setattr(stats, name, value)
        # Every outcome counted in one aggregation over the staged frames.
        outcomes = (
            adapted.select("click_id", F.lit("joined").alias("outcome"))
            .unionByName(unjoinable.select("click_id", "outcome"))
            .join(answers, "click_id", "left")
            .select("outcome", "status")
            .unionByName(labelled(still_pending, "pending", None))
            .unionByName(labelled(too_old_seen, "too_old_seen", "too_old"))
            .unionByName(labelled(taken, "taken", None))
        )
        rows = outcomes.groupBy("outcome", "status").count().collect()  # a few rows
        counted = {(r["outcome"], r["status"]): r["count"] for r in rows}

        def count(outcome: str | None = None, status: str | None = None) -> int:
            return sum(n for (o, s), n in counted.items() if outcome in (None, o) and status in (None, s))

        stats.skipped_registered = count("taken")
        stats.pending = count("pending")
        stats.joined = count("joined", "held")
        stats.dropped_by_adapter = count("dropped")
        stats.given_up = count("given_up", "held")
        stats.too_old = count(status="too_old")
        stats.invalid_timestamp = count("invalid", "held")
        stats.capped = count("capped", "held")
        stats.refused = count(status="refused")
        mark = stats.timed("counts", mark)

        # 5. Output, keyed by click_id, then what is still pending. A table with nothing to add is
        # not touched: an empty MERGE still costs a Delta commit.
        now = F.current_timestamp()
        if stats.joined:
            joined_rows = adapted.join(winners, "click_id", "left_semi").select(
                *adapted.columns,
                F.lit(dc).alias("joined_by_dc"),
                now.alias("joined_at"),
                F.lit(token).alias("work_unit"),
            )
            write_output(joined_rows, "joined_clicks", tables["joined_clicks"], "click_id", token, attempt)
        if stats.too_old or count("dropped", "held") or stats.given_up or stats.invalid_timestamp or stats.capped:
            unjoinable_rows = (
                unjoinable.join(winners, "click_id", "left_semi")
                .select(*click_fields, "reason")
                .unionByName(
                    clicks.join(too_old, "click_id", "left_semi")
                    .select(*click_fields, F.lit(TOO_OLD_REASON).alias("reason"))
                )
                .select("*", F.lit(dc).alias("dc"), now.alias("recorded_at"), F.lit(token).alias("work_unit"))
            )
            write_output(unjoinable_rows, "unjoinable_clicks", tables["unjoinable_clicks"], "click_id", token, attempt)
        if stats.pending or retrying_pending:
            update_pending(tables["pending_clicks"], dc, token, still_pending, clicks if retrying_pending else None)
        mark = stats.timed("write", mark)
        checkpoint("after_output_write")

        # 6. Output durable: the registry need not keep this token any more.
        registry.clear_tokens(token)
        mark = stats.timed("clear_tokens", mark)

        return stats
    finally:
        event_store.release()
        shutil.rmtree(staging, ignore_errors=True)
