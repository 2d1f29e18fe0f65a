"""The joiner's outputs: every click line seen, joined clicks, unjoinable clicks, and aggregates."""


import time
from functools import partial

import dagster as dg
from pyspark import StorageLevel
from pyspark.sql import functions as F

from photon import faults
from photon_assets.work_unit import PENDING, TAG_PENDING, WorkUnitConfig
from resources.registry import IdRegistryResource
from resources.settings import PipelineSettings
from resources.spark import SparkResource
from resources.storage import WarehouseResource
from spark_ops.aggregates import aggregate_clicks
from spark_ops.ingest import IngestStats, ingest_clicks
from spark_ops.join import join_work_unit, load_adapter
from spark_ops.parse import events, parse_ranges
from spark_ops.tables import latest_snapshot, overwrite, read_table, row_count


def pending_clicks(spark, tables: dict[str, str], dc: str):
    """Every click this datacenter has read; the join skips those already registered, so what
    remains are the clicks still waiting for their query."""
    ledger = read_table(spark, "click_ledger", tables["click_ledger"])
    return ledger.where(F.col("dc") == dc)


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            "click_ledger",
            description="Every valid click line read by each datacenter's pipeline (Delta).",
            kinds={"delta", "spark"},
            group_name="joiner",
        ),
        dg.AssetSpec(
            "joined_clicks",
            deps=["query_logs"],
            description="One row per joined click, never two for one click_id (Delta).",
            kinds={"delta", "spark"},
            group_name="joiner",
        ),
        dg.AssetSpec(
            "unjoinable_clicks",
            description="Clicks resolved without a join, with the reason (Delta).",
            kinds={"delta", "spark"},
            group_name="joiner",
        ),
    ],
    name="join_clicks",
)
def join_clicks(
    context: dg.AssetExecutionContext,
    config: WorkUnitConfig,
    spark: SparkResource,
    warehouse: WarehouseResource,
    registry: IdRegistryResource,
    settings: PipelineSettings,
):
    phases: dict[str, float] = {}
    mark = time.monotonic()

    def phase(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        phases[name] = round(now - mark, 3)
        mark = now

    session = spark.session()
    phase("spark_session")
    tables = warehouse.tables()
    ingest = IngestStats()
    parsed = None
    try:
        if config.kind == PENDING:
            clicks = pending_clicks(session, tables, config.dc).drop("dc", "work_unit", "file", "offset", "length")
        else:
            parsed = parse_ranges(
                session, "click", warehouse.stream_dir(config.dc, "click"), config.byte_ranges(), settings.max_line_bytes
            ).persist(StorageLevel.MEMORY_AND_DISK)
            ingest = ingest_clicks(parsed, config.dc, config.work_unit, tables)
            clicks = events(parsed)
        phase("parse_and_ledger")
        queries = read_table(session, "query_logs", tables["query_logs"]).where(F.col("dc") == config.dc)
        stats = join_work_unit(
            session,
            clicks,
            queries,
            registry.get(),
            config.token,
            config.dc,
            warehouse.staging_dir(config.work_unit, config.attempt),
            tables,
            load_adapter(settings.adapter),
            checkpoint=partial(faults.checkpoint, state_dir=warehouse.layout.root / "state"),
        )
    finally:
        if parsed is not None:
            parsed.unpersist()
    phase("join_total")
    # The pending-retry sensor reads this to know whether this datacenter has clicks waiting.
    context.instance.add_run_tags(context.run_id, {TAG_PENDING: str(stats.pending)})
    common = {"dc": config.dc, "work_unit": config.work_unit, "attempt": config.attempt, "kind": config.kind}
    yield dg.MaterializeResult(
        asset_key="click_ledger",
        metadata={
            **common,
            "dagster/row_count": row_count(session, tables["click_ledger"]),
            "click_lines": ingest.events,
            "quarantined_lines": ingest.quarantined,
            "bytes_read": ingest.bytes_read,
        },
    )
    lag = None if ingest.max_timestamp_us is None else time.time() - ingest.max_timestamp_us / 1e6
    yield dg.MaterializeResult(
        asset_key="joined_clicks",
        metadata={
            **common,
            "dagster/row_count": row_count(session, tables["joined_clicks"]),
            **{f"clicks_{k}": v for k, v in stats.counts().items()},
            "event_time_lag_seconds": dg.FloatMetadataValue(lag),
            **{f"phase_{k}_seconds": v for k, v in {**phases, **stats.phase_seconds}.items()},
        },
    )
    yield dg.MaterializeResult(
        asset_key="unjoinable_clicks",
        metadata={
            **common,
            "dagster/row_count": row_count(session, tables["unjoinable_clicks"]),
            "clicks_added": stats.dropped_by_adapter,
        },
    )


@dg.asset(
    deps=["joined_clicks"],
    description="Per advertiser_id and event-time minute: clicks and cost, recomputed from "
    "joined_clicks so that it is exactly the aggregation of it (Delta).",
    kinds={"delta", "spark"},
    group_name="joiner",
)
def click_aggregates(spark: SparkResource, warehouse: WarehouseResource) -> dg.MaterializeResult:
    session = spark.session()
    tables = warehouse.tables()
    # Pin one snapshot of joined_clicks so the aggregate matches a real version of it.
    version, snapshot = latest_snapshot(session, "joined_clicks", tables["joined_clicks"])
    aggregates = aggregate_clicks(snapshot).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        overwrite(aggregates, "click_aggregates", tables["click_aggregates"])
        rows = aggregates.count()
    finally:
        aggregates.unpersist()
    return dg.MaterializeResult(
        metadata={"dagster/row_count": rows, "joined_clicks_version": version}
    )
