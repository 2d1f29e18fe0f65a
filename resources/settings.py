"""Knobs of the pipeline, with the defaults a production deployment starts from."""

from __future__ import annotations

import functools
import json
import os

import dagster as dg
import pydantic

SETTINGS_ENV = "PHOTON_SETTINGS"


class PipelineSettings(dg.ConfigurableResource):
    # Bad input: lines longer than this are quarantined without being parsed.
    max_line_bytes: int = 65536
    # Work units: a click work unit is small so that joined clicks appear soon; query work units
    # can be larger (the primary stream is 10-100x bigger and only feeds the EventStore).
    click_work_unit_bytes: int = 4 << 20
    query_work_unit_bytes: int = 32 << 20
    # Catching up (at least two normal work units' worth waiting at a tick): work units of up to
    # this size instead, so that a run's fixed cost is paid per 64/128 MB rather than per 4/32 MB.
    # 0: never.
    click_catch_up_work_unit_bytes: int = 64 << 20
    query_catch_up_work_unit_bytes: int = 128 << 20
    # Back-pressure: a log dispatcher cuts no new work units while this many of its own are still
    # queued or running (under `photon up`, runs wait in Dagster's run queue). What arrives meanwhile
    # is cut once one finishes, into units of the catch-up size when it is large: a run's fixed cost
    # is then paid per batch of data, not per sensor tick. 0: no limit.
    dispatcher_max_in_flight: int = 1
    # Under the daemon (`photon up`), sensors tick every 5 s at most (Dagster's sensor loop): a click
    # log dispatcher under back-pressure then cut its next unit 2.6 s on average after the run in
    # flight ended, a third of a click run's cycle at 1,000 clicks/s. Its tick waits up to this long
    # for that run to finish, and cuts at once. A tick still busy when the loop comes round again is
    # skipped for a whole period: at 4.5 s, the cut and the run's submission after a long wait ran
    # past 5 s in 13 % of a live run's ticks (the next cut 2-5 s late); at 3.5 s they have 1.5 s.
    # `photon run` ticks every second and never waits. 0: never.
    dispatcher_tick_wait_seconds: float = 3.5
    # Freshness (photon_assets/freshness.py: the FreshnessPolicy of joined_clicks and click_aggregates, fail
    # window; warn at half of it): under live logs every click pass materializes joined_clicks; none for this
    # long means the pipeline stopped joining. A minute at least (Dagster's minimum window).
    joined_clicks_fresh_within_seconds: float = 600.0
    # Log file map (Photon §3.4.2): an entry every W seconds of event time or M bytes of log.
    log_file_map_every_seconds: int = 10
    log_file_map_every_bytes: int = 1 << 20
    # Adapter (Photon §3.3.1): `module:function` taking and returning a DataFrame of pairs.
    adapter: str = "spark_ops.join:default_adapter"
    # Failed work units are retried with a new run key after base * 2^(attempt-1) seconds.
    retry_backoff_seconds: float = 2.0
    retry_backoff_max_seconds: float = 300.0
    max_attempts: int = 8
    # EventStore memory tier (Photon §3.4.1, resources/event_store/memory_tier.py): the registry service holds
    # the lines of this much event time behind the newest query, and older queries by where their
    # line lies in the logs (~60 bytes a query, ~400 with the line), within this many bytes per
    # datacenter: over it, the oldest give up their lines, then leave. Clicks follow their query by
    # seconds to minutes: at 10,000 queries/s, 512 MiB holds ~2 minutes of lines, or ~15 located.
    query_memory_seconds: float = 600.0
    query_memory_bytes: int = 512 << 20
    # While a query tailer feeds the memory tier (photon/query_tail.py), clicks do not wait for query
    # runs: the query dispatcher cuts the durable tier's work at most this often (sooner once a
    # catch-up unit's worth waits), so that a run's fixed cost (~2.5 s of a warm session's time) is
    # paid for more lines: every 10 s, that was a quarter of a core at 10,000 queries/s.
    query_run_every_seconds: float = 30.0
    # The query tailer keeps what it parsed for the query runs, which build the durable tier from it
    # instead of parsing the lines again (resources/event_store/tail_segments.py), within this many
    # bytes of Parquet per datacenter (the oldest go first; a run that finds its lines gone parses them).
    query_tail_segment_bytes: int = 1 << 30
    # EventStore durable tier: query_logs keeps this much event time of queries behind the newest
    # one; older queries are found through log_file_map in the raw logs. Table maintenance evicts
    # older ones, and deletes the files they were in once no run can still be reading them: after
    # this many whole hours (Delta's VACUUM rounds fractions: 0.25 meant at once; spark_ops/tables.py).
    query_cache_retention_seconds: float = 3600.0
    query_cache_vacuum_retain_hours: int = 1
    # Off the click path (photon_assets/maintenance.py): click_aggregates is refreshed with the rows
    # joined since its last refresh at most this often, and the tables are maintained (durable tier
    # eviction, pending-click records compacted, small files compacted and vacuumed) this often; a
    # table's files are compacted once it holds this many, at most this many tables a run (those
    # with the most files first). A pass appends a file to each hot table: at 16 files all seven were
    # compacted and vacuumed every ~4 minutes, in one run holding a live `photon run`'s passes for
    # 60-84 s, or spread one a run at 12-24 s a run (2026-11-26). Nothing on the click path reads
    # these tables whole, so they may hold more files: at one or two files a pass every ~15 s, 64
    # files is 8-16 minutes.
    aggregates_refresh_seconds: float = 60.0
    # Under the daemon the whole-table checks run this often while the tables change, and once more
    # when the pipeline is idle (sensors/upkeep.py: table_checker).
    table_checks_every_seconds: float = 180.0
    maintenance_every_seconds: float = 60.0
    maintenance_compact_at_files: int = 64
    maintenance_compact_tables_per_run: int = 1
    # Pending clicks (Photon §3.2.1): retried only when query data that could hold their query has
    # arrived, and no sooner than base * 2^(attempts-1) seconds after the last attempt.
    pending_backoff_seconds: float = 2.0
    pending_backoff_max_seconds: float = 600.0
    # A pending click becomes unjoinable once it is this far (event time) behind the query stream's
    # progress and has been looked up at least this many times.
    unjoinable_after_seconds: float = 86400.0
    unjoinable_min_attempts: int = 2
    # Event-time watermark (Facebook §5.3, resources/state/watermark.py): this percentile of the event
    # times of the most recent window of passes, at the smallest window size (in passes, doubling up
    # to max_passes held) at which the last `windows` windows ascend.
    watermark_percentile: float = 5.0
    watermark_windows: int = 4
    watermark_max_passes: int = 64
    # Pacing (Facebook §5.2): while query data waits to be ingested, click lines more than the
    # margin ahead of the query stream's watermark are not cut yet (their queries would not be found
    # and they would go pending); lines held at the same place for max_hold are released (a bogus
    # future timestamp must not hold a file for good); max_hold 0 turns pacing off. The watermark is
    # a low estimate (a live stream's lags its newest event by about a pass): the margin lets the
    # clicks of the last half minute through, whose queries are mostly ingested already.
    pacing_margin_seconds: float = 30.0
    pacing_max_hold_seconds: float = 600.0
    # Active-active (resources/registry/ownership.py): a datacenter's lease in the registry lasts this long and
    # is renewed every quarter of it; once it has expired, the other datacenters take over its share
    # of the click lines. A live datacenter's share that waits at the same offset for the grace
    # (its owner is stuck) is taken over too.
    lease_seconds: float = 6.0
    # Timestamp validity (Facebook §6.7, spark_ops/validity.py): a click more than this ahead of the
    # pipeline's clock, or this far before its query, is unjoinable at once; a future query is kept
    # but moves no progress.
    future_tolerance_seconds: float = 300.0
    before_query_tolerance_seconds: float = 60.0
    takeover_grace_seconds: float = 120.0
    # Per-query click cap (Facebook §6.6, resources/registry/click_caps.py): past this many joined clicks, a
    # query's further clicks are unjoinable with reason "capped". 0: no cap.
    max_clicks_per_query: int = 0


def pipeline_settings() -> PipelineSettings:
    """The settings of this deployment: defaults, overridden by PHOTON_SETTINGS (a JSON object). A
    bad value is a one-line ValueError naming the setting."""
    return settings_of(os.environ.get(SETTINGS_ENV) or "{}")


@functools.lru_cache(maxsize=16)
def settings_of(settings_json: str) -> PipelineSettings:
    """The settings a PHOTON_SETTINGS value gives, made once per value: a resource is immutable, and
    building one (Dagster infers its config schema each time) was ~15 % of an idle deployment's code
    server, whose dispatchers ask for the settings at every tick (py-spy, 2026-11-29)."""
    try:
        return PipelineSettings(**json.loads(settings_json))
    except pydantic.ValidationError as error:
        raise ValueError(f"{SETTINGS_ENV}: " + "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']} (got {e['input']!r})" for e in error.errors())) from None
