"""Dispatchers (Photon §3.2): sensors that tail a datacenter's logs and launch one run per work unit.

Per datacenter: a query log dispatcher, a click log dispatcher, and a pending-click dispatcher that
retries clicks still waiting for their query once new query data has been ingested.

Cursors are small JSON documents with a version field. The byte offsets themselves live in the
work unit log (sensors/work_units.py), written before the runs are requested; the cursor records
how much of that log has been requested, so a tick interrupted in between re-requests the same work
units under the same run keys (which the daemon de-duplicates).
"""


import json
import os
from datetime import datetime, timezone
from pathlib import Path

import dagster as dg

from photon.layout import DataLayout
from photon_assets.jobs import INGEST_QUERIES_JOB, JOIN_CLICKS_JOB
from photon_assets.work_unit import (
    LOG_RANGES,
    PENDING,
    TAG_ATTEMPT,
    TAG_DC,
    TAG_KIND,
    TAG_PENDING,
    TAG_STREAM,
    TAG_WORK_UNIT,
)
from resources.settings import PipelineSettings
from sensors.retries import plan_retries
from sensors.work_units import WorkUnit, WorkUnitLog, cut_work_units, new_ranges

CURSOR_VERSION = 1
# Level of a run's console log (its events are stored in the instance whatever the level).
RUN_LOG_LEVEL_ENV = "PHOTON_RUN_LOG_LEVEL"
MIN_INTERVAL_SECONDS = 1  # the daemon ticks at most every 5 s anyway; `photon run` ticks faster
JOBS = {"query": (INGEST_QUERIES_JOB, "ingest_query_logs"), "click": (JOIN_CLICKS_JOB, "join_clicks")}


def read_cursor(raw: str | None, **defaults) -> dict:
    if not raw:
        return {"v": CURSOR_VERSION, **defaults}
    cursor = json.loads(raw)
    if cursor.get("v") != CURSOR_VERSION:
        raise dg.Failure(f"cursor version {cursor.get('v')} is not {CURSOR_VERSION}: reset the sensor cursor")
    return {**defaults, **cursor}


def write_cursor(cursor: dict) -> str:
    return json.dumps({**cursor, "v": CURSOR_VERSION}, sort_keys=True)


def work_unit_request(dc: str, stream: str, kind: str, unit_id: str, ranges) -> dg.RunRequest:
    job_name, op_name = JOBS[stream]
    config = {"dc": dc, "work_unit": unit_id, "kind": kind, "attempt": 1,
              "ranges": [{"file": f, "start": s, "end": e} for f, s, e in ranges]}
    return dg.RunRequest(
        run_key=unit_id,
        job_name=job_name,
        run_config={
            "ops": {op_name: {"config": config}},
            "loggers": {"console": {"config": {"log_level": os.environ.get(RUN_LOG_LEVEL_ENV, "INFO")}}},
        },
        tags={TAG_DC: dc, TAG_STREAM: stream, TAG_KIND: kind, TAG_WORK_UNIT: unit_id, TAG_ATTEMPT: "1"},
    )


def dispatch_new_bytes(layout: DataLayout, dc: str, stream: str, max_bytes: int) -> WorkUnitLog:
    """Cuts the complete lines that arrived since the last work unit into new work units, and
    records them durably."""
    log = WorkUnitLog.load(layout.dispatcher_state / dc / f"{stream}.jsonl")
    stream_dir = layout.stream_dir(dc, stream)
    ranges = new_ranges(stream_dir, log.next_offsets())
    log.append(cut_work_units(stream_dir, ranges, max_bytes, f"{dc}.{stream}", len(log.units)))
    return log


def log_dispatcher(dc: str, stream: str, data_dir: str) -> dg.SensorDefinition:
    job_name, _ = JOBS[stream]

    @dg.sensor(
        name=f"{stream}_log_dispatcher_{dc}",
        job_name=job_name,
        minimum_interval_seconds=MIN_INTERVAL_SECONDS,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=f"Tails logs/{dc}/{stream}/: new complete lines become work units (one run each); "
        "failed work units are retried under a new run key with backoff.",
    )
    def _dispatcher(context: dg.SensorEvaluationContext, settings: PipelineSettings) -> dg.SensorResult:
        cursor = read_cursor(context.cursor, requested=0)
        max_bytes = settings.query_work_unit_bytes if stream == "query" else settings.click_work_unit_bytes
        log = dispatch_new_bytes(DataLayout(Path(data_dir)), dc, stream, max_bytes)
        fresh: list[WorkUnit] = log.units[cursor["requested"]:]
        requests = [work_unit_request(dc, stream, LOG_RANGES, u.id, u.ranges) for u in fresh]
        retries = plan_retries(context.instance, job_name, dc, settings)
        requests += [r for r in retries.run_requests if r.tags.get(TAG_STREAM) == stream]
        if retries.exhausted:
            context.log.error(f"work units failed {settings.max_attempts} times: {retries.exhausted}")
        skip = None
        if not requests:
            skip = f"no new complete lines in logs/{dc}/{stream}/"
            if retries.waiting:
                skip += f"; {len(retries.waiting)} failed work unit(s) waiting for their retry backoff"
        return dg.SensorResult(
            run_requests=requests,
            cursor=write_cursor({"requested": len(log.units)}),
            skip_reason=skip,
        )

    return _dispatcher


def _latest_success(instance: dg.DagsterInstance, filters: dg.RunsFilter) -> dg.RunRecord | None:
    records = instance.get_run_records(filters, limit=1)
    return records[0] if records else None


def has_pending_clicks(instance: dg.DagsterInstance, dc: str) -> bool:
    """Whether this datacenter has clicks waiting: what the last pending retry left, plus what click
    work units finished since then left."""
    success = [dg.DagsterRunStatus.SUCCESS]
    last_retry = _latest_success(
        instance, dg.RunsFilter(job_name=JOIN_CLICKS_JOB, statuses=success, tags={TAG_DC: dc, TAG_KIND: PENDING})
    )
    if last_retry is not None and int(last_retry.dagster_run.tags.get(TAG_PENDING, "0")) > 0:
        return True
    since = last_retry.start_time if last_retry is not None else None
    filters = dg.RunsFilter(
        job_name=JOIN_CLICKS_JOB,
        statuses=success,
        tags={TAG_DC: dc, TAG_KIND: LOG_RANGES},
        updated_after=None if since is None else datetime.fromtimestamp(since, tz=timezone.utc),
    )
    return any(int(r.dagster_run.tags.get(TAG_PENDING, "0")) > 0 for r in instance.get_run_records(filters))


def query_progress(instance: dg.DagsterInstance, dc: str) -> int:
    """How many query work units this datacenter has ingested: grows whenever new query data lands."""
    return instance.get_runs_count(
        dg.RunsFilter(job_name=INGEST_QUERIES_JOB, statuses=[dg.DagsterRunStatus.SUCCESS], tags={TAG_DC: dc})
    )


def pending_dispatcher(dc: str) -> dg.SensorDefinition:
    @dg.sensor(
        name=f"pending_click_dispatcher_{dc}",
        job_name=JOIN_CLICKS_JOB,
        minimum_interval_seconds=MIN_INTERVAL_SECONDS,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description="Retries this datacenter's pending clicks (query not found yet) once new query "
        "data has been ingested; never in a loop while no query data arrives.",
    )
    def _pending(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        cursor = read_cursor(context.cursor, retries=0, query_progress=0)
        progress = query_progress(context.instance, dc)
        if progress <= cursor["query_progress"]:
            return dg.SensorResult(cursor=write_cursor(cursor), skip_reason="no new query data since the last retry")
        if not has_pending_clicks(context.instance, dc):
            # Clicks that become pending later wait for query data newer than this.
            return dg.SensorResult(
                cursor=write_cursor({**cursor, "query_progress": progress}), skip_reason="no pending clicks"
            )
        unit_id = f"{dc}.pending.{cursor['retries']:08d}"
        return dg.SensorResult(
            run_requests=[work_unit_request(dc, "click", PENDING, unit_id, [])],
            cursor=write_cursor({"retries": cursor["retries"] + 1, "query_progress": progress}),
        )

    return _pending
