"""EventStore inputs (Photon §3.4): parsed recent queries and the sparse log file map."""


import time

import dagster as dg
from pyspark import StorageLevel

from photon_assets.work_unit import WorkUnitConfig
from resources.settings import PipelineSettings
from resources.spark import SparkResource
from resources.storage import WarehouseResource
from spark_ops.ingest import ingest_queries
from spark_ops.parse import parse_ranges
from spark_ops.tables import row_count


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            "query_logs",
            description="Parsed query events of each datacenter's replica (Delta, partitioned by dc).",
            kinds={"delta", "spark"},
            group_name="event_store",
        ),
        dg.AssetSpec(
            "log_file_map",
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
    started = time.monotonic()
    session = spark.session()
    tables = warehouse.tables()
    parsed = parse_ranges(
        session, "query", warehouse.stream_dir(config.dc, "query"), config.byte_ranges(), settings.max_line_bytes
    ).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        stats = ingest_queries(
            parsed,
            config.dc,
            config.work_unit,
            tables,
            settings.log_file_map_every_seconds,
            settings.log_file_map_every_bytes,
        )
    finally:
        parsed.unpersist()
    lag = None if stats.max_timestamp_us is None else time.time() - stats.max_timestamp_us / 1e6
    common = {
        "dc": config.dc,
        "work_unit": config.work_unit,
        "bytes_read": stats.bytes_read,
        "quarantined_lines": stats.quarantined,
        "seconds": round(time.monotonic() - started, 3),
    }
    yield dg.MaterializeResult(
        asset_key="query_logs",
        metadata={
            **common,
            "dagster/row_count": row_count(session, tables["query_logs"]),
            "queries_added": stats.events,
            "event_time_lag_seconds": dg.FloatMetadataValue(lag),
        },
    )
    yield dg.MaterializeResult(
        asset_key="log_file_map",
        metadata={
            **common,
            "dagster/row_count": row_count(session, tables["log_file_map"]),
            "entries_added": stats.map_entries,
        },
    )
