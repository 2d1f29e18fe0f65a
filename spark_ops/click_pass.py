"""A click run's pass over its work unit, assembled in one place: the query stream's progress read
first (the EventStore's tables are read after it), the pending policy from the settings, the
EventStore's durable and logs tiers (spark_ops/query_tiers.py), the unit's clicks (its new lines,
parsed and staged: spark_ops/ingest.py; a retry's ranges divided with the other datacenters first:
resources/registry/ownership.py; the due pending clicks), the join (spark_ops/join.py), the pending
digest the dispatchers read, and the unit finished in the registry. What Dagster adds to it (the
run's opening, checks and metadata) is the asset's: photon_assets/clicks.py.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from resources.event_store.progress import QueryCache, QueryProgress
from resources.registry.api import IdRegistry
from resources.registry.ownership import divide_retry
from resources.runtime import faults
from resources.state.sidecars import EventTimeWatermark
from spark_ops.ingest import IngestStats, PassInputs, ledger_clicks, line_stats, record_clicks, stage_lines
from spark_ops.join import ClickPass, JoinInput, JoinStats, join_work_unit, load_adapter
from spark_ops.meter import PassMeter
from spark_ops.parse import ByteRange, events
from spark_ops.pending import PendingDigest, PendingPolicy, pending_retry
from spark_ops.query_tiers import DurableTiers, EventStore
from spark_ops.tables import read_table
from spark_ops.validity import TimestampValidity

if TYPE_CHECKING:  # for the annotation only: the settings are a Dagster resource, and spark_ops runs without Dagster
    from resources.settings import PipelineSettings


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


def _join_input(inputs: PassInputs, session, registry: IdRegistry, policy: PendingPolicy,
                validity: TimestampValidity) -> tuple[JoinInput, IngestStats]:
    """A click run's clicks: its new lines, parsed, with the due pending clicks when query data for
    them arrived; or, for a pending-click run, those alone. The new lines' ledger append goes with
    them (`JoinInput.record`), for the join to run beside itself."""
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
    retrying = pending_retry(layout, dc, inputs.settings).ready
    due = policy.due(session, pending_path, dc, staging / "due") if retrying else None
    # No line parsed (a retry whose bytes another datacenter finished): nothing to record, and a retry's
    # look for its rows in the ledger, then an empty commit, would cost two Spark actions.
    record = partial(record_clicks, parsed, ingest, inputs.output) if ingest.lines else None
    clicks = events(parsed) if recorded_before is None else events(parsed).unionByName(recorded_before)
    return JoinInput(clicks, due, record), ingest


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
    work, ingest = _join_input(inputs, session, registry, policy, validity)
    meter.phase("parse")
    unit = ClickPass(session, registry, event_store(session, inputs), policy, inputs.work_unit, inputs.attempt,
                     dc, inputs.staging, inputs.tables, adapter=load_adapter(settings.adapter),
                     checkpoint=partial(faults.checkpoint, state_dir=layout.root / "state"),
                     validity=validity, max_clicks_per_query=settings.max_clicks_per_query)
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
