"""The joiner's outputs: every click line seen, joined clicks, unjoinable clicks, and aggregates.
The assets keep Dagster's part (specs, the run's opening, checks, metadata); a click run's pass is
spark_ops/click_pass.py."""


import time

import dagster as dg
import pydantic

from photon_assets.bookkeeping import lines_quarantined, pending_clicks_changed
from photon_assets.checks import WORK_UNIT_CHECK_SPECS, work_unit_checks
from photon_assets.table_metadata import column_schema, table_rows, table_uri, tables_as_they_are
from photon_assets.watermarks import watermark_metadata
from photon_assets.work_unit import WorkUnitConfig, bytes_behind_log_heads, run_opening
from resources.id_registry import IdRegistryResource
from resources.registry.shards import LOOKUP_SCHEMA
from resources.settings import PipelineSettings
from resources.spark.session import SparkResource
from resources.storage import WarehouseResource
from spark_ops.aggregates import refresh_aggregates
from spark_ops.click_pass import join_pass
from spark_ops.ingest import IngestStats
from spark_ops.join import EVENT_STORE_COUNTS, JoinStats, window_advice
from spark_ops.meter import metered
from spark_ops.pending import PendingDigest
from spark_ops.tables import no_rows, row_count
from spark_ops.verification import committed_version, unit_rows


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            "click_ledger",
            metadata=column_schema("click_ledger"),
            description="Every valid click line read by each datacenter's pipeline (Delta).",
            kinds={"delta", "spark"},
            group_name="joiner",
        ),
        dg.AssetSpec(
            "joined_clicks",
            metadata=column_schema("joined_clicks"),
            deps=["query_logs"],
            description="One row per joined click, never two for one click_id (Delta).",
            kinds={"delta", "spark"},
            group_name="joiner",
        ),
        dg.AssetSpec(
            "unjoinable_clicks",
            metadata=column_schema("unjoinable_clicks"),
            description="Clicks resolved without a join, with the reason (Delta).",
            kinds={"delta", "spark"},
            group_name="joiner",
        ),
    ],
    check_specs=WORK_UNIT_CHECK_SPECS,
    name="join_clicks",
    # Any one key may be selected (`dg launch --assets joined_clicks`, `dagster asset materialize --select`:
    # the CLI does not add a multi-asset's other keys as the UI does); a pass writes the three tables whatever
    # the selection, and records all three (`all_recorded`).
    can_subset=True,
)
def join_clicks(context: dg.AssetExecutionContext, config: WorkUnitConfig, spark: SparkResource,
              warehouse: WarehouseResource, registry: IdRegistryResource, settings: PipelineSettings):
    yield from all_recorded(context, _join_clicks(context, config, spark, warehouse, registry, settings))


def all_recorded(context: dg.AssetExecutionContext, results):
    """A pass's results, each table's materialization recorded whatever the run selected: a result of a
    key the run selected is its output; one outside the selection (the run selected a single key of
    join_clicks) is logged as that asset's materialization, with the same metadata."""
    selected = context.selected_asset_keys
    for result in results:
        if isinstance(result, dg.MaterializeResult) and dg.AssetKey.from_coercible(result.asset_key) not in selected:
            context.log_event(dg.AssetMaterialization(asset_key=result.asset_key, metadata=result.metadata))
        else:
            yield result


def _join_clicks(context: dg.AssetExecutionContext, config: WorkUnitConfig, spark: SparkResource,
                 warehouse: WarehouseResource, registry: IdRegistryResource, settings: PipelineSettings):
    with run_opening(context, config, "click", spark, warehouse, registry, settings) as opening:
        if opening.unit is None:
            yield from nothing_new(opening, config.dc)
            return
        config, tables, meter = opening.unit, opening.tables, opening.meter
        batched_before = registry.get().counters()["total"]
        before = {name: committed_version(tables[name]) for name in WRITTEN}
        ingest, stats, digest, watermark = join_pass(opening.inputs, opening.session, registry.get(), meter)
        checks = checked_output(config, tables, before, registry, stats)
        meter.phase("work_unit_checks")
        batching = registry_batching(batched_before, registry.get().counters()["total"])
        behind = bytes_behind_log_heads(warehouse.layout, config.dc, "click")
        rows = table_rows(opening.session, tables, ["click_ledger", "joined_clicks", "unjoinable_clicks", "pending_clicks",
                                                    "quarantined_lines"], ingest.quarantined)
        meter.phase("row_counts")
        cost = opening.cost()
    common = {"dc": config.dc, "work_unit": config.work_unit, "attempt": config.attempt, "kind": config.kind}
    yield dg.MaterializeResult(
        asset_key="click_ledger",
        metadata={**table_uri(tables, "click_ledger"), **common, "dagster/row_count": rows["click_ledger"],
                  **click_ledger_metadata(ingest, behind), **watermark_metadata(watermark)},
    )
    yield dg.MaterializeResult(
        asset_key="joined_clicks",
        metadata={**table_uri(tables, "joined_clicks"), **common, "dagster/row_count": rows["joined_clicks"],
                  **joined_clicks_metadata(ingest, stats, digest, batching, settings), **cost},
    )
    context.log_event(pending_clicks_changed(tables, rows["pending_clicks"], common, digest.pending))
    if ingest.quarantined:
        context.log_event(lines_quarantined(tables, rows["quarantined_lines"], common, "click", ingest.quarantined))
    yield dg.MaterializeResult(
        asset_key="unjoinable_clicks",
        metadata={**table_uri(tables, "unjoinable_clicks"), **common, "dagster/row_count": rows["unjoinable_clicks"],
                  "clicks_added": stats.unjoinable},
    )
    yield from checks


WRITTEN = ("joined_clicks", "unjoinable_clicks")


def nothing_new(opening, dc: str):
    """A catch-up run that found nothing new to read: the tables as they are, and the checks of no rows."""
    yield from tables_as_they_are(opening.session, opening.tables, ["click_ledger", *WRITTEN], dc)
    yield from work_unit_checks(*[no_rows(name).select(["click_id"]) for name in WRITTEN], LOOKUP_SCHEMA.empty_table(),
                                JoinStats())


def checked_output(config: WorkUnitConfig, tables: dict[str, str], before: dict[str, int],
                   registry: IdRegistryResource, stats: JoinStats) -> list[dg.AssetCheckResult]:
    """The work unit checks (photon_assets/checks.py) of what this run wrote: a first attempt's rows are
    those of the commits after `before` (the tables' versions before its join); a retry's, every row
    with its work unit's token."""
    rows = {name: unit_rows(name, tables[name], config.token, before[name] if config.attempt == 1 else None,
                            ["click_id", "timestamp_us"]) for name in WRITTEN}
    registered = registry.get().lookup(rows["joined_clicks"]) if len(rows["joined_clicks"]) else LOOKUP_SCHEMA.empty_table()
    return work_unit_checks(rows["joined_clicks"], rows["unjoinable_clicks"], registered, stats, config.attempt == 1)


def click_ledger_metadata(ingest: IngestStats, behind: int) -> dict:
    """What a click pass reports on `click_ledger`: the lines it read, and what waits to be cut."""
    return {
        "click_lines": ingest.events,
        "quarantined_lines": ingest.quarantined,
        "bytes_read": ingest.bytes_read,
        # A retry's ranges that another datacenter finished while this one was down: not read again.
        "bytes_finished_elsewhere": ingest.bytes_finished_elsewhere,
        "bytes_behind_log_heads": behind,
    }


def joined_clicks_metadata(ingest: IngestStats, stats: JoinStats, digest: PendingDigest, batching: float | None,
                           settings: PipelineSettings) -> dict:
    """What a click pass reports on `joined_clicks`: its counts, latency, batching and window advice."""
    lag = None if ingest.max_timestamp_us is None else time.time() - ingest.max_timestamp_us / 1e6
    return {
        **{f"clicks_{k}": v for k, v in stats.counts().items() if k not in EVENT_STORE_COUNTS},
        **{f"eventstore_{k}": v for k, v in stats.counts().items() if k in EVENT_STORE_COUNTS},
        # The share of this pass's query lookups the memory tier answered.
        "eventstore_memory_hit_ratio": dg.FloatMetadataValue(stats.memory_hit_ratio),
        "pending_clicks_in_dc": digest.pending,
        # From the clicks' event time to this run's output commit.
        **{f"latency_{k}_seconds": dg.FloatMetadataValue(stats.latency_seconds.get(k)) for k in ("p50", "p90")},
        # The registry's server-side batching while this pass ran (every caller's requests).
        "registry_ids_per_transaction": dg.FloatMetadataValue(batching),
        "event_time_lag_seconds": dg.FloatMetadataValue(lag),
        # Window advice (Facebook §6.5): click time minus query time of this run's joins.
        **{f"join_delay_{k}_seconds": dg.FloatMetadataValue(stats.delay_seconds.get(k)) for k in ("p50", "p99", "max")},
        "join_delay_p99_share_of_window": dg.FloatMetadataValue(
            stats.delay_seconds["p99"] / settings.unjoinable_after_seconds if stats.delay_seconds else None),
        "window_advice": window_advice(stats.delay_seconds, settings.unjoinable_after_seconds) or "no clicks joined",
        # The join's own steps, within phase_join_total_seconds.
        **{f"join_{k}_seconds": v for k, v in stats.phase_seconds.items()},
    }


def registry_batching(before: dict, after: dict) -> float | None:
    """Mean ids per registry transaction between two readings of its totals (None: none ran)."""
    transactions = after["transactions"] - before["transactions"]
    return round((after["ids_in_transactions"] - before["ids_in_transactions"]) / transactions, 1) if transactions else None


class AggregatesConfig(dg.Config):
    full: bool = pydantic.Field(
        default=False,
        description="Recompute every (advertiser, minute) key from joined_clicks, instead of only the keys "
        "of rows that changed since the last refresh.",
    )


@dg.asset(
    deps=["joined_clicks"],
    metadata=column_schema("click_aggregates"),
    description="Per advertiser_id and event-time minute: clicks and cost, exactly the aggregation of "
    "joined_clicks at the version its last refresh names (Delta). Refreshed off the click path, by a run "
    "of its own every aggregates_refresh_seconds (the keys of the rows joined since) and by verify; in full after recovery rewrote a table.",
    kinds={"delta", "spark"},
    group_name="joiner",
)
def click_aggregates(
    context: dg.AssetExecutionContext, config: AggregatesConfig, spark: SparkResource, warehouse: WarehouseResource
) -> dg.MaterializeResult:
    with metered() as meter, spark.jobs_counted(f"{context.run_id}/click_aggregates") as jobs:
        session = spark.session()
        tables = warehouse.tables()
        refresh = refresh_aggregates(session, tables["joined_clicks"], tables["click_aggregates"], full=config.full)
        meter.phase("refresh")
        rows = row_count(session, "click_aggregates", tables["click_aggregates"])
        meter.phase("row_counts")
        cost = {**meter.metadata(), **jobs()}
    return dg.MaterializeResult(
        metadata={"dagster/row_count": rows, **table_uri(tables, "click_aggregates"),
                  **{k: v for k, v in refresh.items() if v is not None}, **cost}
    )
