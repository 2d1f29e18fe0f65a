"""Turning a work unit's parsed lines into the EventStore's tiers (the memory tier, query_logs and
log_file_map), the click ledger, and quarantine. Each row carries its work unit, so a retried work
unit that had already committed a table appends nothing more to it (spark_ops/tables.py:
append_once)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from resources.registry import IdRegistry
from resources.watermark import SKETCH_FRACTIONS, merged_sketch
from spark_ops.parse import events, quarantined
from spark_ops.registry_calls import remember_queries
from spark_ops.tables import append_once


@dataclass
class IngestStats:
    lines: int = 0
    events: int = 0
    quarantined: int = 0
    future_events: int = 0  # valid, but from the future: they move no timestamp (spark_ops/validity.py)
    bytes_read: int = 0
    max_timestamp_us: int | None = None
    # For the stream's watermark (resources/watermark.py): the sketch of the event times not from the
    # future, and how many of those are at or after the watermark the pass read first.
    sketch: list[int] | None = None
    at_or_after_watermark: int = 0
    # Per query writer (`server_ip:process_id`) in these lines: its oldest and newest timestamp.
    writers: dict[str, tuple[int, int]] = field(default_factory=dict)


def log_file_map_entries(queries: DataFrame, every_seconds: int, every_bytes: int) -> DataFrame:
    """Photon's sparse index into the raw query logs (§3.4.2): per file, the first query of every
    `every_seconds` window of event time and of every `every_bytes` span of the file, so a lookup
    finds an entry within W seconds or M bytes before any query."""
    keys = ["file", "server_ip", "process_id"]
    first = F.min(F.struct("offset", "timestamp_us")).alias("entry")
    by_time = queries.groupBy(*keys, F.floor(F.col("timestamp_us") / (every_seconds * 1_000_000))).agg(first)
    by_bytes = queries.groupBy(*keys, F.floor(F.col("offset") / every_bytes)).agg(first)
    return (
        by_time.select(*keys, "entry")
        .unionByName(by_bytes.select(*keys, "entry"))
        .select(*keys, F.col("entry.timestamp_us").alias("timestamp_us"), F.col("entry.offset").alias("offset"))
        .distinct()
    )


def _with_unit(df: DataFrame, dc: str, work_unit: str) -> DataFrame:
    return df.withColumn("dc", F.lit(dc)).withColumn("work_unit", F.lit(work_unit))


@dataclass(frozen=True)
class MemoryTier:
    """Where a query work unit's lines are held in memory (resources/recent_queries.py), and how much."""

    registry: IdRegistry
    retention_seconds: float
    budget_bytes: int


def ingest_queries(
    parsed: DataFrame,
    stats: IngestStats,
    dc: str,
    work_unit: str,
    attempt: int,
    tables: dict[str, str],
    map_every_seconds: int,
    map_every_bytes: int,
    memory: MemoryTier,
    ingested_before_ts: int | None,
    latest_valid_ts: int,
    staging,
    cache_since_us: int | None = None,
) -> tuple[int, int]:
    """`parsed` is read several times: the caller persists it, and passes its `line_stats`. The
    lines go to the memory tier first, then to the durable tier: a query in a table is in memory
    too, unless evicted (the memory tier's horizon says so). Queries older than `cache_since_us`
    skip the durable tier (query_logs): the log file map, which indexes every query, finds them.
    Returns the rows put in memory and the log file map entries added."""
    queries = _with_unit(events(parsed), dc, work_unit)
    remembered = remember_queries(parsed.sparkSession, memory.registry, queries, dc, work_unit, attempt,
                                  ingested_before_ts, latest_valid_ts, memory.retention_seconds,
                                  memory.budget_bytes, staging)
    cached = queries if cache_since_us is None else queries.where(F.col("timestamp_us") >= cache_since_us)
    append_once(cached, "query_logs", tables["query_logs"], work_unit, attempt)
    # Counted and appended from one computation of its two aggregations.
    entries = _with_unit(log_file_map_entries(queries, map_every_seconds, map_every_bytes), dc, work_unit)
    entries = entries.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        added = entries.count()
        append_once(entries, "log_file_map", tables["log_file_map"], work_unit, attempt)
    finally:
        entries.unpersist()
    _quarantine(parsed, stats, dc, "query", work_unit, attempt, tables)
    return remembered, added


def ingest_clicks(parsed: DataFrame, dc: str, work_unit: str, attempt: int, tables: dict[str, str],
                  latest_valid_us: int | None = None, watermark_us: int | None = None) -> IngestStats:
    """Records the work unit's click lines in the ledger and quarantine. The caller persists
    `parsed` and joins its events next."""
    append_once(_with_unit(events(parsed), dc, work_unit), "click_ledger", tables["click_ledger"], work_unit, attempt)
    stats = line_stats(parsed, latest_valid_us=latest_valid_us, watermark_us=watermark_us)
    _quarantine(parsed, stats, dc, "click", work_unit, attempt, tables)
    return stats


def _quarantine(parsed: DataFrame, stats: IngestStats, dc: str, stream: str, work_unit: str, attempt: int,
                tables: dict[str, str]) -> None:
    # Most work units have no bad line, and an empty Delta commit still costs a second.
    if stats.quarantined:
        append_once(quarantined(parsed, dc, stream, work_unit), "quarantined_lines",
                    tables["quarantined_lines"], work_unit, attempt)


def line_stats(parsed: DataFrame, by_writer: bool = False, latest_valid_us: int | None = None,
               watermark_us: int | None = None) -> IngestStats:
    """Counts of a work unit's parsed lines and the sketch of their event times, in one Spark job;
    with `by_writer` (query lines) also each writer's oldest and newest timestamp. One row per
    writer reaches the driver. Events after `latest_valid_us` (from the future:
    spark_ops/validity.py) are counted but move no timestamp."""
    keys = ["server_ip", "process_id"] if by_writer else []
    is_event = F.col("reason").isNull()
    in_time = is_event if latest_valid_us is None else is_event & (F.col("timestamp_us") <= latest_valid_us)
    at_or_after = in_time if watermark_us is None else in_time & (F.col("timestamp_us") >= watermark_us)
    rows = (
        parsed.groupBy(*keys)
        .agg(
            F.count("*").alias("lines"),
            F.count_if(is_event).alias("events"),
            F.coalesce(F.sum("length"), F.lit(0)).alias("bytes_read"),
            F.count_if(is_event & ~in_time).alias("future"),
            F.min(F.when(in_time, F.col("timestamp_us"))).alias("min_ts"),
            F.max(F.when(in_time, F.col("timestamp_us"))).alias("max_ts"),
            F.percentile_approx(F.when(in_time, F.col("timestamp_us")), SKETCH_FRACTIONS).alias("sketch"),
            F.count_if(at_or_after).alias("at_or_after"),
        )
        .collect()
    )
    lines = sum(r["lines"] for r in rows)
    valid = sum(r["events"] for r in rows)
    newest = [r["max_ts"] for r in rows if r["max_ts"] is not None]
    sketches = [(r["events"] - r["future"], r["sketch"]) for r in rows if r["sketch"] is not None]
    return IngestStats(
        lines=lines,
        events=valid,
        quarantined=lines - valid,
        future_events=sum(r["future"] for r in rows),
        bytes_read=sum(r["bytes_read"] for r in rows),
        max_timestamp_us=max(newest, default=None),
        sketch=None if not sketches else sketches[0][1] if len(sketches) == 1 else merged_sketch(sketches),
        at_or_after_watermark=sum(r["at_or_after"] for r in rows),
        writers={f"{r['server_ip']}:{r['process_id']}": (r["min_ts"], r["max_ts"])
                 for r in rows if by_writer and r["max_ts"] is not None},
    )
