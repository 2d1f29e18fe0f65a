"""Dispatchers (Photon §3.2): sensors that tail a datacenter's logs and launch one run per work unit.

Per datacenter: a query log dispatcher, a click log dispatcher, and a pending-click dispatcher that
retries clicks still waiting for their query once new query data has been ingested. With several
replicas, the click log dispatcher cuts only its datacenter's share (resources/registry/ownership.py).

Cursors are small JSON documents with a version field. The byte offsets themselves live in the
work unit log (resources/state/work_unit_log.py), written before the runs are requested; the cursor records
how much of that log has been requested, so a tick interrupted in between re-requests the same work
units under the same run keys (which the daemon de-duplicates).
"""


import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import dagster as dg

from photon_assets.jobs import JOIN_CLICKS_JOB, STREAM_JOBS
from photon_assets.work_unit import (
    LOG_RANGES,
    PENDING_RETRY,
    TAG_ATTEMPT,
    TAG_DC,
    TAG_KIND,
    TAG_STREAM,
    TAG_WORK_UNIT,
    WorkUnitMaker,
    log_run_finished_since,
    log_runs_in_flight,
    work_units_failed_for_good,
    work_units_in_flight,
)
from resources.event_store.progress import QueryTail
from resources.settings import PipelineSettings
from resources.state.layout import DataLayout
from resources.state.sidecars import EventTimeWatermark
from resources.state.work_unit_log import WorkUnit, WorkUnitLog, cut_work_units, event_time_cut, line_timestamp, new_ranges
from sensors.deps import SensorDeps, sensor_instance
from sensors.retries import plan_retries
from spark_ops.pending import pending_retry

CURSOR_VERSION = 1
# Level of a run's console log (its events are stored in the instance whatever the level).
RUN_LOG_LEVEL_ENV = "PHOTON_RUN_LOG_LEVEL"
MIN_INTERVAL_SECONDS = 1  # the daemon ticks at most every 5 s anyway; `photon run` ticks faster
# More than this many normal work units' worth waiting is cut into catch-up units: a run's fixed
# cost (Delta commits, snapshots, statistics; ~12-20 s for a click run on 2 cores) is then paid once
# per catch-up unit, not per normal unit. One: in a live run at 1,000 clicks/s a pass found 4-9 MB of
# click lines, which normal units of 4 MiB cut into two runs on every other pass (each ~14 s).
CATCH_UP_AFTER_UNITS = 1


def read_cursor(raw: str | None, **defaults) -> dict:
    if not raw:
        return {"v": CURSOR_VERSION, **defaults}
    cursor = json.loads(raw)
    if cursor.get("v") != CURSOR_VERSION:
        raise dg.Failure(f"cursor version {cursor.get('v')} is not {CURSOR_VERSION}: reset the sensor cursor")
    return {**defaults, **cursor}


def write_cursor(cursor: dict) -> str:
    return json.dumps({**cursor, "v": CURSOR_VERSION}, sort_keys=True)


def run_loggers() -> dict:
    """The run config of a run's console log, at the level `photon run` asks for."""
    return {"loggers": {"console": {"config": {"log_level": os.environ.get(RUN_LOG_LEVEL_ENV, "INFO")}}}}


def work_unit_request(dc: str, stream: str, kind: str, unit_id: str, ranges) -> dg.RunRequest:
    job_name, op_name = STREAM_JOBS[stream]
    config = {"dc": dc, "work_unit": unit_id, "kind": kind, "attempt": 1, "clock_us": time.time_ns() // 1000,
              "ranges": [{"file": f, "start": s, "end": e} for f, s, e in ranges]}
    return dg.RunRequest(
        run_key=unit_id,
        job_name=job_name,
        run_config={"ops": {op_name: {"config": config}}, **run_loggers()},
        tags={TAG_DC: dc, TAG_STREAM: stream, TAG_KIND: kind, TAG_WORK_UNIT: unit_id, TAG_ATTEMPT: "1"},
    )


def earliest_timestamp_us(stream_dir: Path, ranges: list[tuple[str, int, int]], max_line_bytes: int) -> int | None:
    """Event time of the oldest new line: the first line of each new range (a writer logs in
    timestamp order). Lines that do not parse are left to the parser's quarantine."""
    firsts = []
    for file, start, _ in ranges:
        with open(stream_dir / file, "rb") as f:
            f.seek(start)
            firsts.append(line_timestamp(f.readline(max_line_bytes)))
    return min((ts for ts in firsts if ts is not None), default=None)


@dataclass(frozen=True)
class Pacing:
    ranges: list[tuple[str, int, int]]  # the click lines to cut now
    held: dict[str, list]  # file -> [offset of its first held line, held there since]
    reason: str = ""
    ahead_seconds: float | None = None


def query_data_waiting(layout: DataLayout, dc: str, instance: dg.DagsterInstance, tail: QueryTail) -> bool:
    """Whether query data that will advance the query stream's progress waits: with a query tailer
    feeding the memory tier, complete lines it has not read yet; without one, complete lines not cut
    into work units yet, or query work units not finished (running, or to be retried)."""
    if tail.fresh():
        return bool(new_ranges(layout.stream_dir(dc, "query"), tail.offsets))
    cut = WorkUnitLog.load(layout.work_unit_log(dc, "query"))
    if new_ranges(layout.stream_dir(dc, "query"), cut.next_offsets()):
        return True
    return any(unit.startswith(f"{dc}.query.") for unit in work_units_in_flight(instance))


def query_watermark_file(layout: DataLayout, dc: str, tail: QueryTail) -> Path:
    """The query stream's watermark pacing goes by: the query tailer's while it feeds the memory tier
    (within a second of the logs), else the query runs'."""
    return layout.watermark_file(dc, "query_tail" if tail.fresh() else "query")


def tailed_ranges(ranges: list[tuple[str, int, int]], tailed: dict[str, int]) -> list[tuple[str, int, int]]:
    """The part of new query lines the query tailer has read (`tailed`: file -> offset, at a line's
    end): while it feeds the memory tier, the query runs build the durable tier from the lines it
    parsed (resources/event_store/tail_segments.py), so they are cut behind it."""
    clipped = [(file, start, min(end, tailed.get(file, start))) for file, start, end in ranges]
    return [(file, start, end) for file, start, end in clipped if end > start]


def query_run_deferred(stream: str, ranges: list, cursor: dict, tail: QueryTail, settings: PipelineSettings,
                       now: float, click_path_cold: Callable[[], bool]) -> str:
    """Why the query log dispatcher cuts nothing now ('' when it cuts). While a query tailer feeds
    the memory tier, the query runs only build the durable tier, off the click path: they are cut at
    most every `query_run_every_seconds`, and not while `click_path_cold` (this process's first click
    run has not ended: that run pays the JVM's start, 15-17 s at 1,000 clicks/s, and a query run cut
    at the first tick paid its own beside it on the same two cores; cut after it, the first query run
    meets warm click runs; asked only when nothing else decides). Either gives way once a catch-up
    unit's worth waits."""
    if stream != "query" or not ranges or not tail.fresh():
        return ""
    if sum(end - start for _, start, end in ranges) >= settings.query_catch_up_work_unit_bytes:
        return ""
    if click_path_cold():
        return "the query tailer feeds the memory tier and this process's first click run has not ended: " \
               "the durable tier's first unit waits for it"
    if now - cursor.get("cut_at", 0.0) < settings.query_run_every_seconds:
        return f"the query tailer feeds the memory tier: the durable tier is cut every {settings.query_run_every_seconds:.0f} s"
    return ""


def click_path_cold(instance: dg.DagsterInstance, dc: str, cursor: dict, started_at: float, settings: PipelineSettings,
                    now: float) -> bool:
    """Whether this process (started at `started_at`; 0: no start to mind) has yet to see one of the
    datacenter's click runs end: while its first one runs, or, before that one starts, within
    `query_run_every_seconds` of the start (with no click to join, the durable tier waits no longer
    than its cadence). Once warm, recorded in the cursor."""
    if not started_at or cursor.get("warm_since") == started_at:
        return False
    if log_run_finished_since(instance, dc, "click", started_at):
        cursor["warm_since"] = started_at
        return False
    return log_runs_in_flight(instance, dc, "click") > 0 or now - started_at < settings.query_run_every_seconds


def pace_clicks(maker: WorkUnitMaker, ranges: list[tuple[str, int, int]], held_before: dict[str, list],
                query_waiting: bool, now: float, watermark_file: Path | None = None) -> Pacing:
    """Stream synchronisation (Facebook §5.2): while query data that will advance the query
    stream waits, click lines more than `pacing_margin_seconds` ahead of its event-time watermark
    (resources/state/watermark.py) are not cut yet. Cut now, their queries would not be found and they would take the longer way
    through pending-click retries. A file's held lines are released once they have been held at
    the same place for `pacing_max_hold_seconds` (a bogus future timestamp must not hold a file for
    good); nothing is held while no query data waits (a stalled or lagging query stream)."""
    layout, dc, settings = maker.layout, maker.dc, maker.settings
    if not ranges or settings.pacing_max_hold_seconds <= 0 or not query_waiting:
        return Pacing(ranges, {})
    stream_dir = layout.stream_dir(dc, "click")
    watermark = EventTimeWatermark.load(watermark_file or layout.watermark_file(dc, "query")).watermark_us
    bound = None if watermark is None else watermark + int(settings.pacing_margin_seconds * 1e6)
    cut_ranges, held, released = [], {}, []
    for file, start, end in ranges:  # a file's pieces in order (the share may split it)
        if file in held:
            continue  # past the line the file is held at
        cut = start if bound is None else event_time_cut(stream_dir / file, start, end, bound, settings.max_line_bytes)
        if cut < end:
            offset, since = held_before.get(file, (None, now))
            since = since if offset == cut else now
            if now - since >= settings.pacing_max_hold_seconds:
                released.append(file)
                cut = end
            else:
                held[file] = [cut, since]
        if cut > start:
            cut_ranges.append((file, start, cut))
    if released:
        reason = f"released click lines of {len(released)} file(s) held for {settings.pacing_max_hold_seconds:.0f} s"
    elif held:
        behind = "have no queries yet" if watermark is None else "are behind"
        reason = (f"pacing: the query logs of {dc} {behind} the click lines of {len(held)} file(s) "
                  f"(margin {settings.pacing_margin_seconds:.0f} s); holding those lines back")
    else:
        reason = ""
    ahead = None
    if held and watermark is not None:
        first = earliest_timestamp_us(stream_dir, [(f, o, 0) for f, (o, _) in held.items()], settings.max_line_bytes)
        ahead = None if first is None else (first - watermark) / 1e6
    return Pacing(cut_ranges, held, reason, ahead)


# Set by `photon up`: its daemon runs the dispatchers without anyone starting them in the UI.
SENSORS_RUNNING_ENV = "PHOTON_SENSORS_RUNNING"


def ticked_by_daemon() -> bool:
    """Whether this process's sensors are `photon up`'s, ticked by its daemon (PHOTON_SENSORS_RUNNING)."""
    return bool(os.environ.get(SENSORS_RUNNING_ENV))


def default_status() -> dg.DefaultSensorStatus:
    """Stopped unless PHOTON_SENSORS_RUNNING is set; a status set in the UI or by `photon run` wins."""
    return dg.DefaultSensorStatus.RUNNING if ticked_by_daemon() else dg.DefaultSensorStatus.STOPPED


def work_unit_bytes(stream: str, backlog_bytes: int, settings: PipelineSettings) -> int:
    """Size of the work units cut now: up to the catch-up size while more than `CATCH_UP_AFTER_UNITS`
    normal work units' worth is waiting (a backlog, or a pipeline that fell behind)."""
    if stream == "query":
        normal, catch_up = settings.query_work_unit_bytes, settings.query_catch_up_work_unit_bytes
    else:
        normal, catch_up = settings.click_work_unit_bytes, settings.click_catch_up_work_unit_bytes
    return catch_up if catch_up > normal and backlog_bytes > CATCH_UP_AFTER_UNITS * normal else normal


def log_dispatcher(dc: str, stream: str, data_dir: str, deps: SensorDeps) -> dg.SensorDefinition:
    job_name, _ = STREAM_JOBS[stream]

    @dg.sensor(
        name=f"{stream}_log_dispatcher_{dc}",
        job_name=job_name,
        minimum_interval_seconds=MIN_INTERVAL_SECONDS,
        default_status=default_status(),
        description=f"Tails logs/{dc}/{stream}/: new complete lines become work units (one run each); "
        "failed work units are retried under a new run key with backoff."
        + (" Click lines ahead of the query stream's event-time watermark wait while query data is being ingested "
           "(pacing). With several replicas, only this datacenter's share of the click files, and the "
           "share of one whose lease lapsed (resources/registry/ownership.py)." if stream == "click" else ""),
    )
    def _dispatcher(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        maker = WorkUnitMaker(DataLayout(Path(data_dir)), dc, stream, deps.registry, deps.settings)
        if stream == "click" and deps.ticked_by_daemon:
            await_run_end(sensor_instance(context), maker)
        return dispatch(context, maker, deps.started_at)

    return _dispatcher


# How often a waiting tick looks at the run in flight (a count of its runs in the instance).
RUN_END_POLL_SECONDS = 0.1


def await_run_end(instance: dg.DagsterInstance, maker: WorkUnitMaker) -> None:
    """Under back-pressure, waits up to `dispatcher_tick_wait_seconds` for one of the dispatcher's
    runs in flight to finish, so that the tick cuts the next unit as soon as it may (no lock is held
    meanwhile: a catch-up run may cut units of its own)."""
    limit, wait = maker.settings.dispatcher_max_in_flight, maker.settings.dispatcher_tick_wait_seconds
    deadline = time.monotonic() + wait
    while 0 < limit <= log_runs_in_flight(instance, maker.dc, maker.stream) and time.monotonic() < deadline:
        time.sleep(RUN_END_POLL_SECONDS)


@dataclass
class Held:
    """New lines a tick leaves uncut, why, and the pacing observations to log."""

    ranges: list
    reason: str = ""
    observations: list = field(default_factory=list)
    skipped: list = field(default_factory=list)  # ranges another datacenter finished: recorded, no run


def dispatch(context: dg.SensorEvaluationContext, maker: WorkUnitMaker, started_at: float = 0.0) -> dg.SensorResult:
    """One tick of a log dispatcher: new complete lines cut into work units (held back by
    back-pressure, the query runs' cadence or pacing; only this datacenter's share), recorded and
    claimed before their runs are requested, with the retries of failed units."""
    dc, stream, settings = maker.dc, maker.stream, maker.settings
    cursor = read_cursor(context.cursor, requested=0, held={}, paced_ticks=0, waiting={})
    cursor.pop("held_since", None)  # the whole-tick hold of earlier versions
    instance = sensor_instance(context)
    # Held from reading the offsets to the append: a catch-up run may cut units too.
    with maker.locked() as log:
        held = cut_now(context, instance, maker, log, cursor, started_at)
        ranges, skipped = held.ranges, held.skipped
        max_bytes = work_unit_bytes(stream, sum(end - start for _, start, end in ranges), settings)
        stream_dir = maker.layout.stream_dir(dc, stream)
        units = cut_work_units(stream_dir, ranges, max_bytes, f"{dc}.{stream}", len(log.units), skipped)
        # Recorded durably before any run is requested: a crash in between re-requests the same units.
        log.append(units)
        if units and stream == "query":
            cursor["cut_at"] = time.time()  # the durable tier's cadence (query_run_deferred)
        fresh: list[WorkUnit] = [u for u in log.units[cursor["requested"]:] if u.dispatched]
        maker.claim(fresh)
        cursor["requested"] = len(log.units)
    return tick_result(context, instance, maker, [work_unit_request(dc, stream, LOG_RANGES, u.id, u.ranges) for u in fresh],
                       cursor, held)


def cut_now(context: dg.SensorEvaluationContext, instance: dg.DagsterInstance, maker: WorkUnitMaker, log: WorkUnitLog,
            cursor: dict, started_at: float = 0.0) -> Held:
    """The new lines to cut this tick: none under back-pressure or while the query tailer makes the
    query runs wait for their cadence; click lines ahead of the query stream held back (pacing)."""
    dc, stream, settings, layout = maker.dc, maker.stream, maker.settings, maker.layout
    in_flight = log_runs_in_flight(instance, dc, stream)
    backed_up = 0 < settings.dispatcher_max_in_flight <= in_flight
    ranges = [] if backed_up else maker.new_ranges(log)
    tail = QueryTail.load(layout.query_tail_file(dc))
    if stream == "query" and tail.fresh():
        ranges = tailed_ranges(ranges, tail.offsets)
    now = time.time()
    deferred = query_run_deferred(stream, ranges, cursor, tail, settings, now,
                                  lambda: click_path_cold(instance, dc, cursor, started_at, settings, now))
    if stream == "query":
        cursor["deferred"] = bool(deferred)
    if backed_up:
        return Held([], f"back-pressure: {in_flight} work unit(s) of logs/{dc}/{stream}/ queued or running; "
                        "new lines are cut when one finishes")
    if deferred:
        return Held([], f"logs/{dc}/query/: {deferred}")
    if stream != "click":
        return Held(ranges)
    return paced_share(context, instance, maker, ranges, cursor, tail)


def paced_share(context: dg.SensorEvaluationContext, instance: dg.DagsterInstance, maker: WorkUnitMaker,
                ranges: list[tuple[str, int, int]], cursor: dict, tail: QueryTail) -> Held:
    """The new click lines to cut: this datacenter's share of them (several replicas), then held back
    by pacing where they run ahead of the query stream."""
    dc, layout = maker.dc, maker.layout
    # This datacenter's share first, pacing after: a range another datacenter finished is skipped
    # without a run, and needs no query, so pacing holds only the lines joined here. Paced first, a
    # datacenter back from an outage held what the other one had joined while it was down until its
    # query tailer had read the outage's query logs (minutes: benchmarks/README.md, round twenty-five).
    skipped, share_reason = [], ""
    share = maker.share(ranges, cursor["waiting"])
    if share is not None:
        if share.taken_over:
            context.log.warning(f"taking over click lines of {sorted(share.taken_over)}: "
                                f"{sum(share.taken_over.values())} bytes (lease expired or past the grace)")
        cursor["waiting"] = share.waiting
        ranges, skipped = share.cut, share.skipped
        if share.waiting and not ranges:
            share_reason = f"{len(share.waiting)} click file(s) are another datacenter's share while its lease lives"
    waiting = bool(ranges) and query_data_waiting(layout, dc, instance, tail)
    pacing = pace_clicks(maker, ranges, cursor["held"], waiting, time.time(), query_watermark_file(layout, dc, tail))
    # A file's recorded ranges stay contiguous: what it skips past the line pacing holds it at waits too.
    skipped = [(f, start, end) for f, start, end in skipped if f not in pacing.held or end <= pacing.held[f][0]]
    observations = []
    if pacing.held and not cursor["held"]:
        context.log.info(pacing.reason)
        observations.append(pacing_observation(dc, True, pacing.ahead_seconds))
    elif cursor["held"] and not pacing.held:
        context.log.info(f"pacing: no click lines of {dc} held any more. {pacing.reason}")
        observations.append(pacing_observation(dc, False, pacing.ahead_seconds))
    cursor["paced_ticks"] += bool(pacing.held)
    cursor["held"] = pacing.held
    return Held(pacing.ranges, pacing.reason or share_reason, observations, skipped)


def tick_result(context: dg.SensorEvaluationContext, instance: dg.DagsterInstance, maker: WorkUnitMaker,
                requests: list[dg.RunRequest], cursor: dict, held: Held) -> dg.SensorResult:
    """The tick's runs (the fresh units' and the retries due), its cursor, and why it skipped if it did."""
    dc, stream, settings = maker.dc, maker.stream, maker.settings
    retries = plan_retries(instance, stream, dc, settings, maker.layout)
    requests = requests + retries.run_requests
    if retries.exhausted:
        context.log.error(f"work units failed {settings.max_attempts} times: {retries.exhausted}")
    skip = None
    if not requests:
        skip = held.reason or f"no new complete lines in logs/{dc}/{stream}/"
        if retries.waiting:
            skip += f"; {len(retries.waiting)} failed work unit(s) waiting for their retry backoff"
    return dg.SensorResult(run_requests=requests, cursor=write_cursor(cursor), skip_reason=skip,
                           asset_events=held.observations)


def pacing_observation(dc: str, holding: bool, ahead_seconds: float | None) -> dg.AssetObservation:
    """The pacing metric, on the click ledger's timeline in the UI."""
    return dg.AssetObservation(
        asset_key="click_ledger",
        metadata={
            "dc": dc,
            "pacing_holding": holding,
            "clicks_ahead_of_queries_seconds": dg.FloatMetadataValue(ahead_seconds),
        },
    )


def pending_dispatcher(dc: str, data_dir: str, deps: SensorDeps) -> dg.SensorDefinition:
    @dg.sensor(
        name=f"pending_click_dispatcher_{dc}",
        job_name=JOIN_CLICKS_JOB,
        minimum_interval_seconds=MIN_INTERVAL_SECONDS,
        default_status=default_status(),
        description="Retries this datacenter's pending clicks (query not found yet) when query data "
        "that could hold their queries has arrived, within their backoff; never in a loop while no "
        "query data arrives.",
    )
    def _pending(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        cursor = read_cursor(context.cursor, retries=0)
        instance = sensor_instance(context)
        # One retry of pending clicks at a time: a running one, or a failed one awaiting its own
        # retry (or a human), decides what is still pending.
        unfinished = sorted(
            unit for unit in work_units_in_flight(instance) | work_units_failed_for_good(instance)
            if unit.startswith(f"{dc}.{PENDING_RETRY}.")
        )
        if unfinished:
            return dg.SensorResult(cursor=write_cursor(cursor), skip_reason=f"pending-click retry {unfinished[0]} is not done")
        decision = pending_retry(DataLayout(Path(data_dir)), dc, deps.settings)
        if not decision.ready:
            return dg.SensorResult(cursor=write_cursor(cursor), skip_reason=decision.reason)
        context.log.info(f"retrying pending clicks of {dc}: {decision.reason}")
        unit_id = f"{dc}.pending.{cursor['retries']:08d}"
        return dg.SensorResult(
            run_requests=[work_unit_request(dc, "click", PENDING_RETRY, unit_id, [])],
            cursor=write_cursor({"retries": cursor["retries"] + 1}),
        )

    return _pending
