"""The joiner (Photon §3.3) as a Spark micro-batch: look up, adapt, register, write.

One call processes one work unit's clicks:
1. dispatcher lookup: clicks already registered under another token are skipped (joined elsewhere);
   ids registered under *this* token are kept (a retry of this work unit gets its own ids back);
2. EventStore lookup: each click's query from `query_logs`; clicks without one stay pending;
3. adapter: business logic over (click, query) pairs; it may alter or drop rows;
4. conditional commit of the surviving ids (and of dropped ones, recorded as unjoinable) with the
   work unit's token, as one registry transaction;
5. the winners are inserted into `joined_clicks` / `unjoinable_clicks` keyed by `click_id`;
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

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from resources.registry import IdRegistry
from spark_ops.handoff import stage, unstage
from spark_ops.tables import TABLE_SCHEMAS, insert_new

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


@dataclass
class JoinStats:
    clicks: int = 0
    skipped_registered: int = 0
    pending: int = 0
    joined: int = 0
    dropped_by_adapter: int = 0
    refused: int = 0  # wasted joins: joined here, refused by the registry
    phase_seconds: dict[str, float] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return {k: v for k, v in asdict(self).items() if k != "phase_seconds"}

    def timed(self, phase: str, started: float) -> float:
        now = time.monotonic()
        self.phase_seconds[phase] = round(now - started, 3)
        return now


def query_lookup_table(query_logs: DataFrame) -> DataFrame:
    return query_logs.select(
        "query_id",
        F.struct("query_id", "timestamp_us", "query_text", "ads", "extra").alias("query"),
    )


def click_columns(clicks: DataFrame) -> DataFrame:
    return clicks.select(
        "click_id", "query_id", "timestamp_us", "ad_id", "advertiser_id", "cost_micros",
        F.col("extra").alias("click_extra"),
    )


def join_work_unit(
    spark: SparkSession,
    clicks: DataFrame,
    queries: DataFrame,
    registry: IdRegistry,
    token: str,
    dc: str,
    staging: Path,
    tables: dict[str, str],
    adapter: Adapter = default_adapter,
    checkpoint: Callable[[str], None] = lambda point: None,
) -> JoinStats:
    """`clicks`: parsed click events (any duplicates); `queries`: this datacenter's query_logs."""
    stats = JoinStats()
    mark = time.monotonic()
    staging.mkdir(parents=True, exist_ok=True)
    held = []

    def keep(df: DataFrame) -> DataFrame:
        held.append(df.persist(StorageLevel.MEMORY_AND_DISK))
        return df

    try:
        clicks = keep(click_columns(clicks).dropDuplicates(["click_id"]))
        stats.clicks = clicks.count()
        mark = stats.timed("dedupe", mark)
        if stats.clicks == 0:
            return stats

        # 1. Dispatcher lookup.
        registered = unstage(
            spark, registry.lookup(stage(clicks.select("click_id"), staging / "lookup_ids")), staging / "registered"
        )
        taken = registered.where(F.col("token").isNull() | (F.col("token") != token)).select("click_id")
        candidates = clicks.join(taken, "click_id", "left_anti")
        mark = stats.timed("lookup", mark)

        # 2. EventStore lookup. A query id may repeat in the logs (duplicate lines): one match each.
        pairs = keep(
            candidates.join(query_lookup_table(queries), "query_id", "left").dropDuplicates(["click_id"])
        )
        found = pairs.where(F.col("query").isNotNull())

        # 3. Adapter. Clicks it drops are resolved as unjoinable, through the registry like joins.
        schema = TABLE_SCHEMAS["joined_clicks"][0]
        adapted = keep(adapter(found).select(*[c for c in schema.fieldNames() if c in found.columns]))
        dropped = found.join(adapted.select("click_id"), "click_id", "left_anti").drop("query")
        n_adapted = adapted.count()
        mark = stats.timed("eventstore_and_adapter", mark)

        # 4. Conditional commit, one transaction for the batch.
        checkpoint("before_registry_commit")
        resolved = adapted.select("click_id", "timestamp_us").unionByName(dropped.select("click_id", "timestamp_us"))
        winners = keep(
            unstage(spark, registry.commit(stage(resolved, staging / "commit_ids"), token), staging / "winners")
        )
        n_winners = winners.count()
        mark = stats.timed("registry_commit", mark)
        checkpoint("after_registry_commit")

        # 5. Output, keyed by click_id.
        now = F.current_timestamp()
        joined_rows = adapted.join(winners, "click_id", "left_semi").select(
            *adapted.columns,
            F.lit(dc).alias("joined_by_dc"),
            now.alias("joined_at"),
            F.lit(token).alias("work_unit"),
        )
        insert_new(joined_rows, "joined_clicks", tables["joined_clicks"], "click_id")
        unjoinable_rows = dropped.join(winners, "click_id", "left_semi").select(
            *dropped.columns,
            F.lit("dropped by adapter").alias("reason"),
            F.lit(dc).alias("dc"),
            now.alias("recorded_at"),
            F.lit(token).alias("work_unit"),
        )
        insert_new(unjoinable_rows, "unjoinable_clicks", tables["unjoinable_clicks"], "click_id")
        mark = stats.timed("write", mark)
        checkpoint("after_output_write")

        # 6. Output durable: the registry need not keep this token any more.
        registry.clear_tokens(token)
        mark = stats.timed("clear_tokens", mark)

        n_pairs = pairs.count()
        stats.skipped_registered = stats.clicks - n_pairs
        stats.pending = pairs.where(F.col("query").isNull()).count()
        stats.joined = adapted.join(winners, "click_id", "left_semi").count()
        stats.dropped_by_adapter = (n_pairs - stats.pending) - n_adapted
        stats.refused = (n_adapted + stats.dropped_by_adapter) - n_winners
        stats.timed("counts", mark)
        return stats
    finally:
        for df in held:
            df.unpersist()
        shutil.rmtree(staging, ignore_errors=True)
