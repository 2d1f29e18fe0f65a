"""A click run's pass over its work unit, assembled in one place; photon_assets/clicks.py gives it
its inputs (PassInputs, from the run config) and shows what it returns. In order:

1. what is fixed for the pass (`fixed_for_the_pass`, a ClickPass: spark_ops/join.py): the query
   stream's progress, read before the EventStore's tables so that it never claims more than they
   hold; the pending policy from the settings; the EventStore's durable and logs tiers
   (spark_ops/query_tiers.py); the timestamp rules by the unit's clock (spark_ops/validity.py);
2. its clicks (`click_input`): a log-range unit's new lines, parsed and staged (spark_ops/ingest.py;
   a retry's ranges divided with the other datacenters first: resources/registry/ownership.py),
   with the due pending clicks when the retry trigger says query data for them arrived
   (spark_ops/pending.py: pending_retry); a pending-retry unit's due pending clicks alone;
3. the join (spark_ops/join.py: join_work_unit), which appends the new lines to the ledger beside
   itself, registers the clicks it resolves and writes the outputs;
4. its end: the pending digest the dispatchers read, a log-range unit finished in the registry, and
   the click stream's watermark moved.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from resources.event_store.progress import QueryCache, QueryProgress
from resources.registry.api import IdRegistry
from resources.registry.ownership import divide_retry
from resources.runtime import faults
from resources.state.sidecars import EventTimeWatermark
from spark_ops.ingest import (IngestStats, PassInputs, UnitOutput, ledger_clicks, line_stats, pass_watermark,
                              record_clicks, stage_lines)
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
    """The pending rule's knobs from the settings, over the query stream's `progress`."""
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


def fixed_for_the_pass(inputs: PassInputs, session, registry: IdRegistry) -> ClickPass:
    """What every step of the join needs and that is fixed for the pass."""
    layout, dc, settings = inputs.layout, inputs.dc, inputs.settings
    # Read before the EventStore's tables: the progress never claims more than they hold.
    progress = QueryProgress.load(layout.query_progress_file(dc))
    validity = TimestampValidity.of(inputs.clock_us, settings.future_tolerance_seconds,
                                    settings.before_query_tolerance_seconds)
    return ClickPass(session, registry, event_store(session, inputs), pending_policy(progress, settings),
                     inputs.work_unit, inputs.attempt, dc, inputs.staging, inputs.tables,
                     adapter=load_adapter(settings.adapter),
                     checkpoint=partial(faults.checkpoint, state_dir=layout.root / "state"),
                     validity=validity, max_clicks_per_query=settings.max_clicks_per_query)


def new_lines(unit: ClickPass, inputs: PassInputs) -> tuple[DataFrame, DataFrame, IngestStats]:
    """A log-range unit's clicks, its lines parsed and staged, and their counts. A retry after an
    outage parses again only the ranges no other datacenter finished meanwhile; of the clicks of
    those it did, the ones this unit recorded in the ledger are looked up again (the only ones it may
    have registered)."""
    layout, dc, staging = inputs.layout, inputs.dc, inputs.staging
    ranges, recorded_before, finished = inputs.ranges, None, []
    if inputs.attempt > 1:
        retry = divide_retry(unit.registry, dc, [(r.file, r.start, r.end) for r in ranges])
        ranges, finished = [ByteRange(*r) for r in retry.read], [ByteRange(*r) for r in retry.finished]
        recorded_before = ledger_clicks(unit.spark, inputs.tables["click_ledger"], inputs.work_unit, finished)
    parsed = stage_lines(unit.spark, "click", layout.stream_dir(dc, "click"), ranges,
                         inputs.settings.max_line_bytes, staging / "lines")
    watermark = EventTimeWatermark.load(layout.watermark_file(dc, "click")).watermark_us
    ingest = line_stats(staging / "lines", latest_valid_us=unit.validity.latest_valid_us, watermark_us=watermark)
    ingest.bytes_finished_elsewhere = sum(r.end - r.start for r in finished)
    clicks = events(parsed) if recorded_before is None else events(parsed).unionByName(recorded_before)
    return clicks, parsed, ingest


def click_input(unit: ClickPass, inputs: PassInputs) -> tuple[JoinInput, IngestStats]:
    """A click run's clicks: its new lines, with the due pending clicks when query data for them
    arrived; or, for a pending-retry unit, those alone. The new lines' ledger append goes with them
    (`JoinInput.record`), for the join to run beside itself."""
    def due() -> DataFrame | None:
        return unit.pending.due(unit.spark, inputs.tables["pending_clicks"], inputs.dc, inputs.staging / "due")

    if inputs.pending_only:
        return JoinInput(None, due()), IngestStats()
    clicks, parsed, ingest = new_lines(unit, inputs)
    # Pending clicks that query data arrived for are retried here rather than by a run of
    # their own: a live pass then pays one click run's fixed cost, not two.
    retried = due() if pending_retry(inputs.layout, inputs.dc, inputs.settings).ready else None
    output = UnitOutput(inputs.dc, inputs.work_unit, inputs.attempt, inputs.tables)
    # No line parsed (a retry whose bytes another datacenter finished): nothing to record, and a retry's
    # look for its rows in the ledger, then an empty commit, would cost two Spark actions.
    record = partial(record_clicks, parsed, ingest, output) if ingest.lines else None
    return JoinInput(clicks, retried, record), ingest


def join_pass(inputs: PassInputs, session, registry: IdRegistry,
              meter: PassMeter) -> tuple[IngestStats, JoinStats, PendingDigest, EventTimeWatermark]:
    """One click work unit (the module docstring's steps). Returns its new lines' counts, the join's,
    what is still pending in its datacenter and the click stream's watermark."""
    unit = fixed_for_the_pass(inputs, session, registry)
    work, ingest = click_input(unit, inputs)
    meter.phase("parse")
    stats = join_work_unit(unit, work)
    meter.phase("join_total")
    digest = unit.pending.digest(inputs.tables["pending_clicks"], inputs.dc)
    digest.save(inputs.layout.pending_digest_file(inputs.dc))
    meter.phase("pending_digest")
    if not inputs.pending_only:
        # Once everything is written: other datacenters skip these bytes from now on
        # (resources/registry/ownership.py); a crash before it leaves them waiting for this unit's retry.
        registry.finish_work(inputs.work_unit, pending=stats.pending > 0)
        meter.phase("finish_work")
    return ingest, stats, digest, pass_watermark(inputs, "click", ingest)
