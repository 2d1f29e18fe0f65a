"""Retries of failed work units (Photon §3.2.1: at-least-once with exponential backoff).

The daemon never relaunches a run key that has a run, even a failed one, so attempt n+1 of a work
unit is requested under its own key `<work unit>#<n+1>` with the same configuration (the same byte
ranges and the same registry token). Runs killed with their process are marked failed by the
runner (see photon/runner.py) or by Dagster's run monitoring, and then retried the same way.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import dagster as dg

from photon_assets.work_unit import TAG_ATTEMPT, TAG_DC, TAG_RECOVERED, TAG_WORK_UNIT
from resources.settings import PipelineSettings, pipeline_settings

UNFINISHED = {
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
}


@dataclass
class RetryPlan:
    run_requests: list[dg.RunRequest] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)  # backoff not elapsed yet
    exhausted: list[str] = field(default_factory=list)  # failed max_attempts times: needs a human


def backoff_seconds(attempt: int, settings: PipelineSettings) -> float:
    return min(settings.retry_backoff_max_seconds, settings.retry_backoff_seconds * 2 ** (attempt - 1))


def _failed_latest_attempts(instance: dg.DagsterInstance, filters: dg.RunsFilter) -> list[dg.RunRecord]:
    """For each work unit with a failed run: its latest attempt, if that failed and none succeeded."""
    failed_units = {
        record.dagster_run.tags[TAG_WORK_UNIT]
        for record in instance.get_run_records(filters)
        if TAG_WORK_UNIT in record.dagster_run.tags
    }
    latest = []
    for unit in sorted(failed_units):
        attempts = instance.get_run_records(dg.RunsFilter(tags={TAG_WORK_UNIT: unit}))
        if any(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS or r.dagster_run.status in UNFINISHED for r in attempts):
            continue
        latest.append(max(attempts, key=lambda r: int(r.dagster_run.tags.get(TAG_ATTEMPT, "1"))))
    return latest


def plan_retries(
    instance: dg.DagsterInstance, job_name: str, dc: str, settings: PipelineSettings, now: float | None = None
) -> RetryPlan:
    now = time.time() if now is None else now
    plan = RetryPlan()
    filters = dg.RunsFilter(job_name=job_name, statuses=[dg.DagsterRunStatus.FAILURE], tags={TAG_DC: dc})
    for record in _failed_latest_attempts(instance, filters):
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
        for op in run_config.get("ops", {}).values():
            if "config" in op and "work_unit" in op["config"]:
                op["config"]["attempt"] = attempt + 1
        tags = {k: v for k, v in run.tags.items() if k.startswith("photon/")}
        tags[TAG_ATTEMPT] = str(attempt + 1)
        plan.run_requests.append(
            dg.RunRequest(run_key=f"{unit}#{attempt + 1}", job_name=job_name, run_config=run_config, tags=tags)
        )
    return plan


def _failed_work_units(instance: dg.DagsterInstance, exhausted: bool) -> set[str]:
    return {r.dagster_run.tags[TAG_WORK_UNIT] for r in _failed_runs(instance, exhausted)}


def _failed_runs(instance: dg.DagsterInstance, exhausted: bool) -> list[dg.RunRecord]:
    max_attempts = pipeline_settings().max_attempts
    records = _failed_latest_attempts(instance, dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
    return [
        r for r in records
        if (int(r.dagster_run.tags.get(TAG_ATTEMPT, "1")) >= max_attempts) == exhausted
        and TAG_RECOVERED not in r.dagster_run.tags
    ]


def runs_failed_for_good(instance: dg.DagsterInstance) -> list[dg.RunRecord]:
    """The last attempt of each work unit that failed max_attempts times and was not recovered."""
    return _failed_runs(instance, exhausted=True)


def mark_recovered(instance: dg.DagsterInstance, record: dg.RunRecord, recovery_run_id: str) -> None:
    """The recovery job made good the clicks of this failed work unit: it is no longer reported."""
    instance.add_run_tags(record.dagster_run.run_id, {TAG_RECOVERED: recovery_run_id})


def work_units_awaiting_retry(instance: dg.DagsterInstance) -> set[str]:
    """Work units whose latest attempt failed and that will be retried."""
    return _failed_work_units(instance, exhausted=False)


def work_units_failed_for_good(instance: dg.DagsterInstance) -> set[str]:
    """Work units that failed max_attempts times: their clicks need a human (or recovery)."""
    return _failed_work_units(instance, exhausted=True)


def work_units_in_flight(instance: dg.DagsterInstance) -> set[str]:
    """Work units with a run not finished, or whose latest attempt failed (a retry will follow)."""
    running = {
        run.tags[TAG_WORK_UNIT]
        for run in instance.get_runs(dg.RunsFilter(statuses=list(UNFINISHED)))
        if TAG_WORK_UNIT in run.tags
    }
    return running | work_units_awaiting_retry(instance)
