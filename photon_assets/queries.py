"""EventStore inputs (Photon §3.4): parsed recent queries and the sparse log file map. The asset keeps
Dagster's part (specs, the run's opening, metadata); a query run's pass is spark_ops/query_pass.py."""


import time

import dagster as dg

from photon_assets.bookkeeping import lines_quarantined
from photon_assets.table_metadata import column_schema, table_rows, table_uri, tables_as_they_are
from photon_assets.watermarks import watermark_metadata
from photon_assets.work_unit import WorkUnitConfig, bytes_behind_log_heads, run_opening
from resources.id_registry import IdRegistryResource
from resources.settings import PipelineSettings
from resources.spark.session import SparkResource
from resources.storage import WarehouseResource
from spark_ops.ingest import IngestStats
from spark_ops.query_pass import ingest_pass


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            "query_logs",
            metadata=column_schema("query_logs"),
            description="The EventStore's durable tier: where each datacenter's valid query lines of the last "
            "query_cache_retention_seconds of event time are in the raw logs (file, offset, length), by query_id "
            "(Delta, partitioned by dc). The recent lines themselves are held in memory by the registry service "
            "(the memory tier).",
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
def ingest_query_logs(context: dg.AssetExecutionContext, config: WorkUnitConfig, spark: SparkResource,
              warehouse: WarehouseResource, registry: IdRegistryResource, settings: PipelineSettings):
    with run_opening(context, config, "query", spark, warehouse, registry, settings) as opening:
        if opening.unit is None:
            yield from tables_as_they_are(opening.session, opening.tables, ["query_logs", "log_file_map"], config.dc)
            return
        config, tables, meter = opening.unit, opening.tables, opening.meter
        stats, boundary, entries_added, watermark = ingest_pass(opening.inputs, opening.session, registry.get(), meter)
        memory = registry.get().counters().get("recent_queries", {}).get(config.dc, {})
        rows = table_rows(opening.session, tables, ["query_logs", "log_file_map", "quarantined_lines"], stats.quarantined)
        meter.phase("row_counts")
        cost = opening.cost()
    common = {
        "dc": config.dc,
        "work_unit": config.work_unit,
        "bytes_read": stats.bytes_read,
        "bytes_behind_log_heads": bytes_behind_log_heads(warehouse.layout, config.dc, "query"),
        "quarantined_lines": stats.quarantined,
        "seconds": round(sum(meter.phases.values()), 3),
    }
    yield dg.MaterializeResult(
        asset_key="query_logs",
        metadata={**table_uri(tables, "query_logs"), **common, "dagster/row_count": rows["query_logs"],
                  **query_logs_metadata(stats, memory, boundary), **watermark_metadata(watermark), **cost},
    )
    if stats.quarantined:
        context.log_event(lines_quarantined(tables, rows["quarantined_lines"], common, "query", stats.quarantined))
    yield dg.MaterializeResult(
        asset_key="log_file_map",
        metadata={
            **table_uri(tables, "log_file_map"),
            **common,
            "dagster/row_count": rows["log_file_map"],
            "entries_added": entries_added,
        },
    )


def query_logs_metadata(stats: IngestStats, memory: dict, boundary: int | None) -> dict:
    """What a query pass reports on `query_logs`: the queries it added, where their lines were parsed,
    the memory tier after it (`memory`: the registry's counters of the datacenter's), the durable
    tier's boundary and the lag of its newest event."""
    lag = None if stats.max_timestamp_us is None else time.time() - stats.max_timestamp_us / 1e6
    return {
        "queries_added": stats.events,
        # Lines the query tailer had parsed, staged from its segments (the rest parsed by this run).
        "lines_parsed_by_the_tailer": stats.lines if stats.parsed_by_the_tailer else 0,
        # The EventStore's memory tier after this pass (resources/event_store/memory_tier.py).
        "memory_tier_queries": memory.get("rows", 0),
        "memory_tier_located_queries": memory.get("located_rows", 0),  # held without their line
        "memory_tier_bytes": memory.get("bytes", 0),
        "queries_from_the_future": stats.future_events,
        **({"cache_since_us": boundary} if boundary is not None else {}),
        "event_time_lag_seconds": dg.FloatMetadataValue(lag),
    }
