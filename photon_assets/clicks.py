"""The joiner's outputs: every click line seen, joined clicks, unjoinable clicks, and aggregates."""


import time
from functools import partial

import dagster as dg
import pydantic
from pyspark.sql import functions as F

from photon_assets.bookkeeping import lines_quarantined, pending_clicks_changed
from photon_assets.checks import WORK_UNIT_CHECK_SPECS, work_unit_checks
from photon_assets.table_metadata import column_schema, table_uri, tables_as_they_are
from photon_assets.watermarks import pass_watermark, watermark_metadata
from photon_assets.work_unit import WorkUnitConfig, bytes_behind_log_heads, run_opening
from resources.event_store.progress import QueryCache, QueryProgress, known_query_progress
from resources.id_registry import IdRegistryResource
from resources.registry.api import IdRegistry
from resources.registry.ownership import divide_retry
from resources.registry.shards import LOOKUP_SCHEMA
from resources.runtime import faults
from resources.settings import PipelineSettings
from resources.spark.session import SparkResource
from resources.state.sidecars import EventTimeWatermark
from resources.storage import WarehouseResource
from spark_ops.aggregates import refresh_aggregates
from spark_ops.query_tiers import DurableTiers, EventStore
from spark_ops.beside import beside, settle_quietly
from spark_ops.ingest import IngestStats, PassInputs, ledger_clicks, line_stats, record_clicks, stage_lines
from spark_ops.join import EVENT_STORE_COUNTS, ClickPass, JoinInput, JoinStats, join_work_unit, load_adapter, window_advice
from spark_ops.meter import PassMeter, metered
from spark_ops.parse import ByteRange, events
from spark_ops.pending import PendingDigest, PendingPolicy, pending_retry_decision
from spark_ops.tables import no_rows, read_table, row_count
from spark_ops.validity import TimestampValidity
from spark_ops.verification import committed_version, unit_rows


def pending_policy(progress: QueryProgress, settings: PipelineSettings) -> PendingPolicy:
    return PendingPolicy(
        progress=progress,
        unjoinable_after_seconds=settings.unjoinable_after_seconds,
        min_attempts=settings.unjoinable_min_attempts,
        backoff_seconds=settings.pending_backoff_seconds,
        backoff_max_seconds=settings.pending_backoff_max_seconds,
    )


def event_store(session, inputs: PassInputs) -> EventStore:
    """The durable and logs tiers of the unit's datacenter's EventStore (the memory tier is asked by
    the lookup), read when first needed: after the writers' progress (the caller's), as the
    EventStore needs."""
    layout, dc, settings = inputs.layout, inputs.dc, inputs.settings

    def tiers() -> DurableTiers:
        in_dc = F.col("dc") == dc
        cache = QueryCache.load(layout.query_cache_file(dc))  # before the tables
        return DurableTiers(read_table(session, "query_logs", inputs.tables["query_logs"]).where(in_dc),
                            read_table(session, "log_file_map", inputs.tables["log_file_map"]).where(in_dc),
                            cache.complete_from_ts)

    return EventStore(tiers, layout.stream_dir(dc, "query"), settings.log_file_map_every_seconds,
                      settings.log_file_map_every_bytes, settings.max_line_bytes)


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
)
def join_clicks(context: dg.AssetExecutionContext, config: WorkUnitConfig, spark: SparkResource,
              warehouse: WarehouseResource, registry: IdRegistryResource, settings: PipelineSettings):
    with run_opening(context, config, "click", spark, warehouse, registry, settings) as opening:
        if opening.unit is None:
            yield from tables_as_they_are(opening.session, opening.tables, ["click_ledger", "joined_clicks",
                                                                            "unjoinable_clicks"], config.dc)
            yield from work_unit_checks(*[no_rows(name).select(["click_id"]) for name in WRITTEN], LOOKUP_SCHEMA.empty_table(),
                                        JoinStats())
            return
        config, session, tables, meter = opening.unit, opening.session, opening.tables, opening.meter
        batched_before = registry.get().counters()["total"]
        before = {name: committed_version(tables[name]) for name in WRITTEN}
        ingest, stats, digest = join_pass(opening.inputs, session, registry.get(), meter)
        checks = checked_output(config, tables, before, registry, stats)
        meter.phase("work_unit_checks")
        batching = registry_batching(batched_before, registry.get().counters()["total"])
        behind = bytes_behind_log_heads(warehouse.layout, config.dc, "click")
        watermark = pass_watermark(warehouse, settings, config.dc, "click", config.work_unit, ingest)
        common = {"dc": config.dc, "work_unit": config.work_unit, "attempt": config.attempt, "kind": config.kind}
        ledger_rows = row_count(session, "click_ledger", tables["click_ledger"])
        joined_rows = row_count(session, "joined_clicks", tables["joined_clicks"])
        unjoinable_rows = row_count(session, "unjoinable_clicks", tables["unjoinable_clicks"])
        pending_rows = row_count(session, "pending_clicks", tables["pending_clicks"])
        quarantine_rows = row_count(session, "quarantined_lines", tables["quarantined_lines"]) if ingest.quarantined else 0
        meter.phase("row_counts")
        cost = opening.cost()
    yield dg.MaterializeResult(
        asset_key="click_ledger",
        metadata={
            **table_uri(tables, "click_ledger"),
            **common,
            "dagster/row_count": ledger_rows,
            "click_lines": ingest.events,
            "quarantined_lines": ingest.quarantined,
            "bytes_read": ingest.bytes_read,
            # A retry's ranges that another datacenter finished while this one was down: not read again.
            "bytes_finished_elsewhere": ingest.bytes_finished_elsewhere,
            "bytes_behind_log_heads": behind,
            **watermark_metadata(watermark),
        },
    )
    yield dg.MaterializeResult(
        asset_key="joined_clicks",
        metadata={**table_uri(tables, "joined_clicks"), **common, "dagster/row_count": joined_rows,
                  **joined_clicks_metadata(ingest, stats, digest, batching, settings), **cost},
    )
    context.log_event(pending_clicks_changed(tables, pending_rows, common, digest.pending))
    if ingest.quarantined:
        context.log_event(lines_quarantined(tables, quarantine_rows, common, "click", ingest.quarantined))
    yield dg.MaterializeResult(
        asset_key="unjoinable_clicks",
        metadata={
            **table_uri(tables, "unjoinable_clicks"),
            **common,
            "dagster/row_count": unjoinable_rows,
            "clicks_added": stats.unjoinable,
        },
    )
    yield from checks


WRITTEN = ("joined_clicks", "unjoinable_clicks")


def checked_output(config: WorkUnitConfig, tables: dict[str, str], before: dict[str, int],
                   registry: IdRegistryResource, stats: JoinStats) -> list[dg.AssetCheckResult]:
    """The work unit checks (photon_assets/checks.py) of what this run wrote: a first attempt's rows are
    those of the commits after `before` (the tables' versions before its join); a retry's, every row
    with its work unit's token."""
    rows = {name: unit_rows(name, tables[name], config.token, before[name] if config.attempt == 1 else None,
                            ["click_id", "timestamp_us"]) for name in WRITTEN}
    registered = registry.get().lookup(rows["joined_clicks"]) if len(rows["joined_clicks"]) else LOOKUP_SCHEMA.empty_table()
    return work_unit_checks(rows["joined_clicks"], rows["unjoinable_clicks"], registered, stats, config.attempt == 1)


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


def _join_input(inputs: PassInputs, session, registry: IdRegistry, policy: PendingPolicy,
                validity: TimestampValidity) -> tuple[JoinInput, IngestStats]:
    """A click run's clicks: its new lines, parsed, with the due pending clicks when query data for
    them arrived; or, for a pending-click run, those alone. The new lines' ledger append is started
    here, beside the join (`JoinInput.recorded`), which waits for it before its registry commit."""
    dc, layout, tables, staging = inputs.dc, inputs.layout, inputs.tables, inputs.staging
    pending_path = tables["pending_clicks"]
    if inputs.pending_only:
        return JoinInput(None, policy.due(session, pending_path, dc, staging / "due")), IngestStats()
    ranges, recorded_before, finished = inputs.ranges, None, []
    if inputs.attempt > 1:
        # A retry after an outage: the ranges another datacenter finished meanwhile are not parsed
        # again; of their clicks, those this unit recorded in the ledger are looked up again.
        retry = divide_retry(registry, dc, [(r.file, r.start, r.end) for r in ranges])
        ranges, finished = [ByteRange(*r) for r in retry.read], [ByteRange(*r) for r in retry.finished]
        recorded_before = ledger_clicks(session, tables["click_ledger"], inputs.work_unit, finished)
    parsed = stage_lines(session, "click", layout.stream_dir(dc, "click"), ranges,
                         inputs.settings.max_line_bytes, staging / "lines")
    ingest = line_stats(staging / "lines", latest_valid_us=validity.latest_valid_us, watermark_us=EventTimeWatermark.load(
        layout.watermark_file(dc, "click")).watermark_us)
    ingest.bytes_finished_elsewhere = sum(r.end - r.start for r in finished)
    # Pending clicks that query data arrived for are retried here rather than by a run of
    # their own: a live pass then pays one click run's fixed cost, not two.
    retrying = pending_retry_decision(
        PendingDigest.load(layout.pending_digest_file(dc)),
        known_query_progress(*layout.query_progress_files(dc)), inputs.settings.unjoinable_after_seconds,
    ).ready
    due = policy.due(session, pending_path, dc, staging / "due") if retrying else None
    # Started last, so that nothing here can fail with it under way (join_pass guards the rest).
    # No line parsed (a retry whose bytes another datacenter finished): nothing to record, and a retry's
    # look for its rows in the ledger, then an empty commit, would cost two Spark actions.
    recorded = (beside(session, partial(record_clicks, parsed, ingest, inputs.output), f"{inputs.work_unit}-ledger")
                if ingest.lines else None)
    clicks = events(parsed) if recorded_before is None else events(parsed).unionByName(recorded_before)
    return JoinInput(clicks, due, recorded), ingest


def join_pass(inputs: PassInputs, session, registry: IdRegistry,
              meter: PassMeter) -> tuple[IngestStats, JoinStats, PendingDigest]:
    """One click work unit: its new lines parsed and recorded in the ledger, joined with the due
    pending clicks, and what is still pending summed up for the sensors."""
    layout, dc, settings = inputs.layout, inputs.dc, inputs.settings
    # Read before the EventStore's tables: the progress never claims more than they hold.
    progress = QueryProgress.load(layout.query_progress_file(dc))
    policy = pending_policy(progress, settings)
    validity = TimestampValidity.of(inputs.clock_us, settings.future_tolerance_seconds,
                                    settings.before_query_tolerance_seconds)
    pending_path = inputs.tables["pending_clicks"]
    work = None
    try:
        work, ingest = _join_input(inputs, session, registry, policy, validity)
        meter.phase("parse")
        unit = ClickPass(session, registry, event_store(session, inputs), policy, inputs.work_unit, inputs.attempt,
                         dc, inputs.staging, inputs.tables, adapter=load_adapter(settings.adapter),
                         checkpoint=partial(faults.checkpoint, state_dir=layout.root / "state"),
                         validity=validity, max_clicks_per_query=settings.max_clicks_per_query)
    except BaseException:
        settle_quietly(work and work.recorded)  # the join, which waits for it otherwise, will not run
        raise
    stats = join_work_unit(unit, work)
    meter.phase("join_total")
    digest = policy.digest(pending_path, dc)
    digest.save(layout.pending_digest_file(dc))
    meter.phase("pending_digest")
    if not inputs.pending_only:
        # Last, once everything is written: other datacenters skip these bytes from now on
        # (resources/registry/ownership.py); a crash before it leaves them waiting for this unit's retry.
        registry.finish_work(inputs.work_unit, pending=stats.pending > 0)
        meter.phase("finish_work")
    return ingest, stats, digest


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
