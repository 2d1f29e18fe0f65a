"""Retries of failed work units (Photon §3.2.1: at-least-once with exponential backoff).

The daemon never relaunches a run key that has a run, even a failed one, so attempt n+1 of a work
unit is requested under its own key `<work unit>#<n+1>` with the same configuration (the same byte
ranges and the same registry token). Runs killed with their process are marked failed by the next
`photon run` or `photon up` (photon/deployment.py: fail_orphaned_runs), by a running `photon up`
(photon/up.py: fail_dead_runs) or by Dagster's run monitoring, and then retried the same way; so are
runs canceled because `photon up` stopped before they finished (photon/up.py). A
catch-up run materialized with no work unit in its config cut its unit for itself: its retry names
that unit, read back from the work unit log.
Which work units are in flight, awaiting a retry or failed for good is read from the instance by
`photon_assets/work_unit.py`.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import dagster as dg

from photon_assets.jobs import STREAM_JOBS
from photon_assets.work_unit import (
    ENDED_EARLY,
    TAG_ATTEMPT,
    TAG_DC,
    TAG_RECOVERED,
    TAG_STREAM,
    TAG_WORK_UNIT,
    catch_up_config,
    failed_latest_attempts,
)
from resources.settings import PipelineSettings
from resources.state.layout import DataLayout
from resources.state.work_unit_log import WorkUnitLog


@dataclass
class RetryPlan:
    run_requests: list[dg.RunRequest] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)  # backoff not elapsed yet
    exhausted: list[str] = field(default_factory=list)  # failed max_attempts times: needs a human


def backoff_seconds(attempt: int, settings: PipelineSettings) -> float:
    return min(settings.retry_backoff_max_seconds, settings.retry_backoff_seconds * 2 ** (attempt - 1))


def plan_retries(
    instance: dg.DagsterInstance, stream: str, dc: str, settings: PipelineSettings, layout: DataLayout,
    now: float | None = None,
) -> RetryPlan:
    now = time.time() if now is None else now
    job_name, op_name = STREAM_JOBS[stream]
    plan = RetryPlan()
    filters = dg.RunsFilter(statuses=ENDED_EARLY, tags={TAG_DC: dc, TAG_STREAM: stream})
    for record in failed_latest_attempts(instance, filters):
        run = record.dagster_run
        if TAG_RECOVERED in run.tags:
            continue
        unit = run.tags[TAG_WORK_UNIT]
        attempt = int(run.tags.get(TAG_ATTEMPT, "1"))
        if attempt >= settings.max_attempts:
            plan.exhausted.append(unit)
            continue
        failed_at = record.end_time or record.update_timestamp.timestamp()
        if now - failed_at < backoff_seconds(attempt, settings):
            plan.waiting.append(unit)
            continue
        run_config = copy.deepcopy(dict(run.run_config))
        config = run_config.setdefault("ops", {}).setdefault(op_name, {}).setdefault("config", {})
        if not config.get("work_unit"):  # a catch-up run, which cut its unit for itself
            cut = WorkUnitLog.load(layout.work_unit_log(dc, stream)).unit(unit)
            if cut is None:  # it died before recording the unit: nothing was cut, nothing to redo
                instance.add_run_tags(run.run_id, {TAG_RECOVERED: "no work unit recorded"})
                continue
            config.update(catch_up_config(dc, cut))
        config["attempt"] = attempt + 1
        tags = {k: v for k, v in run.tags.items() if k.startswith("photon/")}
        tags[TAG_ATTEMPT] = str(attempt + 1)
        plan.run_requests.append(
            dg.RunRequest(run_key=f"{unit}#{attempt + 1}", job_name=job_name, run_config=run_config, tags=tags)
        )
    return plan
