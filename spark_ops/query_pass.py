"""A query run's pass over its work unit, assembled in one place; photon_assets/queries.py gives it
its inputs (PassInputs, from the run config) and shows what it returns. Its lines staged (from the
query tailer's segments when they cover them, else parsed: spark_ops/ingest.py) and put into the
EventStore's memory tier, the durable tier's boundary recorded, the appends to query_logs, the log
file map and quarantine, then the query stream's progress, the cache bounds and its watermark.
"""

from __future__ import annotations

import shutil

from resources.event_store.memory_tier import Holding
from resources.event_store.progress import QueryCache, QueryProgress, durable_tier_boundary_us
from resources.event_store.tail_segments import TailSegments
from resources.registry.api import IdRegistry
from resources.state.sidecars import EventTimeWatermark
from spark_ops.ingest import (IngestStats, PassInputs, UnitOutput, ingest_queries, line_stats, pass_watermark,
                              stage_queries)
from spark_ops.meter import PassMeter
from spark_ops.registry_calls import QueryPut


def ingest_pass(inputs: PassInputs, session, registry: IdRegistry,
                meter: PassMeter) -> tuple[IngestStats, int | None, int, EventTimeWatermark]:
    """A query work unit's lines parsed into the EventStore's tiers (memory, query_logs and the log
    file map); the writers' progress recorded once they are there, and the query stream's watermark
    moved. Returns the line counts, the durable tier's boundary, the map entries added and the
    watermark."""
    layout, dc, settings, staging = inputs.layout, inputs.dc, inputs.settings, inputs.staging
    progress_file = layout.query_progress_file(dc)
    watermark = EventTimeWatermark.load(layout.watermark_file(dc, "query")).watermark_us
    latest_valid = inputs.clock_us + int(settings.future_tolerance_seconds * 1e6)
    before = QueryProgress.load(progress_file).max_ts
    put = QueryPut(registry, dc, inputs.work_unit, inputs.attempt, before,
                   Holding(latest_valid, settings.query_memory_seconds, settings.query_memory_bytes),
                   tailed=registry.tail_state(dc) is not None)
    try:
        parsed, from_tailer = stage_queries(session, layout.stream_dir(dc, "query"), inputs.ranges,
                                            settings.max_line_bytes, put, staging / "parsed",
                                            TailSegments(layout.query_tail_segments_dir(dc), settings.max_line_bytes))
        # A query from the future is kept, but moves neither progress, the watermark nor the cache boundary.
        stats = line_stats(staging / "parsed", by_writer=True, latest_valid_us=latest_valid, watermark_us=watermark)
        stats.parsed_by_the_tailer = from_tailer
        meter.phase("parse")
        newest = max([before or 0, *(ts for _, ts in stats.writers.values())], default=0)
        boundary = durable_tier_boundary_us(newest or None, settings.query_cache_retention_seconds)
        if boundary is not None:
            QueryCache.caching_from(layout.query_cache_file(dc), boundary)
        output = UnitOutput(dc, inputs.work_unit, inputs.attempt, inputs.tables)
        entries_added = ingest_queries(parsed, staging / "parsed", stats, output, settings.log_file_map_every_seconds,
                                       settings.log_file_map_every_bytes, cache_since_us=boundary)
        meter.phase("append")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    # Only after the appends: a click run that reads this progress finds these queries in a table.
    QueryProgress.merge(progress_file, stats.writers)
    if stats.writers:
        # A lower bound of what this unit cached: nothing older than the boundary went in.
        oldest = min(ts for ts, _ in stats.writers.values())
        QueryCache.cached(layout.query_cache_file(dc), oldest if boundary is None else max(oldest, boundary))
    return stats, boundary, entries_added, pass_watermark(inputs, "query", stats)
