"""EventStore inputs (Photon §3.4): parsed recent queries and the sparse log file map."""


import time

import dagster as dg
from pyspark import StorageLevel

from photon_assets.bookkeeping import lines_quarantined
from photon_assets.table_metadata import column_schema, table_uri
from photon_assets.watermarks import pass_watermark, watermark_metadata
from photon_assets.work_unit import WorkUnitConfig, run_start_costs
from resources.settings import PipelineSettings
from resources.spark import SparkResource
from resources.storage import WarehouseResource
from resources.stream_state import EventTimeWatermark, QueryCache, QueryProgress
from spark_ops.event_store import evict_from_cache
from spark_ops.ingest import IngestStats, ingest_queries, line_stats
from spark_ops.meter import PassMeter, metered
from spark_ops.parse import parse_ranges
from spark_ops.tables import row_count


def cache_boundary_us(progress_ts: int | None, retention_seconds: float) -> int | None:
    """Oldest event time the cache tier keeps: the query stream's progress minus the retention.
    Progress is capped at the wall clock, so a bogus future timestamp cannot empty the cache."""
    if progress_ts is None:
        return None
    return min(progress_ts, time.time_ns() // 1000) - int(retention_seconds * 1_000_000)


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            "query_logs",
            metadata=column_schema("query_logs"),
            description="Parsed query events of each datacenter's replica (Delta, partitioned by dc).",
            kinds={"delta", "spark"},
            group_name="event_store",
        ),
        dg.AssetSpec(
            "log_file_map",
            metadata=column_schema("log_file_map"),
            description="Sparse index (server_ip, process_id, timestamp_us) -> (file, offset) into the "
            "raw query logs, an entry every W seconds or M bytes (Delta).",
            kinds={"delta", "spark"},
            group_name="event_store",
        ),
    ],
    name="ingest_query_logs",
)
def ingest_query_logs(
    context: dg.AssetExecutionContext,
    config: WorkUnitConfig,
    spark: SparkResource,
    warehouse: WarehouseResource,
    settings: PipelineSettings,
):
    with metered() as meter, spark.jobs_counted(f"{context.run_id}/ingest_query_logs") as jobs:
        session = spark.session()
        session.conf.get("spark.sql.shuffle.partitions")  # the first call: a Connect client reaches its server here
        start_costs = run_start_costs(context)
        meter.phase("spark_session")
        tables = warehouse.tables()
        stats, boundary, entries_added = ingest_pass(config, session, warehouse, settings, tables, meter)
        watermark = pass_watermark(warehouse, settings, config.dc, "query", config.work_unit, stats)
        evicted, scanned = evict_pass(config, session, warehouse, settings, tables, boundary, stats)
        meter.phase("evict")
        cached_rows = row_count(session, "query_logs", tables["query_logs"])
        map_rows = row_count(session, "log_file_map", tables["log_file_map"])
        quarantine_rows = row_count(session, "quarantined_lines", tables["quarantined_lines"]) if stats.quarantined else 0
        meter.phase("row_counts")
        cost = {**meter.metadata(), **jobs(), **start_costs}
    lag = None if stats.max_timestamp_us is None else time.time() - stats.max_timestamp_us / 1e6
    common = {
        "dc": config.dc,
        "work_unit": config.work_unit,
        "bytes_read": stats.bytes_read,
        "quarantined_lines": stats.quarantined,
        "seconds": round(sum(meter.phases.values()), 3),
    }
    yield dg.MaterializeResult(
        asset_key="query_logs",
        metadata={
            **table_uri(tables, "query_logs"),
            **common,
            "dagster/row_count": cached_rows,
            "queries_added": stats.events,
            "queries_from_the_future": stats.future_events,
            "queries_evicted": evicted,
            "cache_eviction_scanned": scanned,
            **({"cache_since_us": boundary} if boundary is not None else {}),
            "event_time_lag_seconds": dg.FloatMetadataValue(lag),
            **watermark_metadata(watermark),
            **cost,
        },
    )
    if stats.quarantined:
        context.log_event(lines_quarantined(tables, quarantine_rows, common, "query", stats.quarantined))
    yield dg.MaterializeResult(
        asset_key="log_file_map",
        metadata={
            **table_uri(tables, "log_file_map"),
            **common,
            "dagster/row_count": map_rows,
            "entries_added": entries_added,
        },
    )


def ingest_pass(
    config: WorkUnitConfig, session, warehouse: WarehouseResource, settings: PipelineSettings,
    tables: dict[str, str], meter: PassMeter,
) -> tuple[IngestStats, int | None, int]:
    """A query work unit's lines parsed into the cache tier and the log file map; the writers'
    progress recorded once they are there. Returns the line counts, the cache boundary and the map
    entries added."""
    parsed = parse_ranges(
        session, "query", warehouse.stream_dir(config.dc, "query"), config.byte_ranges(), settings.max_line_bytes
    ).persist(StorageLevel.MEMORY_AND_DISK)
    progress_file = warehouse.layout.query_progress_file(config.dc)
    watermark = EventTimeWatermark.load(warehouse.layout.watermark_file(config.dc, "query")).watermark_us
    try:
        # A query from the future is kept, but moves neither progress, the watermark nor the cache boundary.
        stats = line_stats(parsed, by_writer=True,
                           latest_valid_us=config.clock() + int(settings.future_tolerance_seconds * 1e6),
                           watermark_us=watermark)
        meter.phase("parse")
        newest = max([QueryProgress.load(progress_file).max_ts or 0, *(ts for _, ts in stats.writers.values())], default=0)
        boundary = cache_boundary_us(newest or None, settings.query_cache_retention_seconds)
        if boundary is not None:
            QueryCache.caching_from(warehouse.layout.query_cache_file(config.dc), boundary)
        entries_added = ingest_queries(
            parsed,
            stats,
            config.dc,
            config.work_unit,
            config.attempt,
            tables,
            settings.log_file_map_every_seconds,
            settings.log_file_map_every_bytes,
            cache_since_us=boundary,
        )
        meter.phase("append")
    finally:
        parsed.unpersist()
    # Only after the appends: a click run that reads this progress finds these queries in a table.
    QueryProgress.merge(progress_file, stats.writers)
    return stats, boundary, entries_added


def evict_pass(
    config: WorkUnitConfig, session, warehouse: WarehouseResource, settings: PipelineSettings,
    tables: dict[str, str], boundary: int | None, stats: IngestStats,
) -> tuple[int, bool]:
    """Queries older than the cache boundary leave the cache tier, when the boundary has passed the
    oldest one it may hold. Returns the rows evicted and whether the cache was scanned."""
    cache_file = warehouse.layout.query_cache_file(config.dc)
    if stats.writers:
        # A lower bound of what this unit cached: nothing older than the boundary went in.
        oldest = min(ts for ts, _ in stats.writers.values())
        cache = QueryCache.cached(cache_file, oldest if boundary is None else max(oldest, boundary))
    else:
        cache = QueryCache.load(cache_file)
    if boundary is None or not cache.needs_eviction(boundary):
        return 0, False
    evicted, oldest_kept = evict_from_cache(
        session, tables["query_logs"], config.dc, boundary, settings.query_cache_vacuum_retain_hours
    )
    QueryCache.scanned(cache_file, boundary if oldest_kept is None else oldest_kept)
    return evicted, True
