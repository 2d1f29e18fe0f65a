"""`photon up`'s reaper of runs whose process died (photon/up.py: fail_dead_runs), on a real instance
with real processes."""

import os
import subprocess
import sys

import dagster as dg
from dagster._core.events import EngineEventData  # the event a run worker logs its pid in

from photon.up import fail_dead_runs
from photon_assets.work_unit import TAG_DC

STARTED = dg.DagsterRunStatus.STARTED


def started_run(instance: dg.DagsterInstance, job_name: str, tags: dict, pid: int) -> str:
    """A started run whose process logged `pid`, as Dagster's run workers do."""
    run = instance.add_run(dg.DagsterRun(job_name=job_name, status=STARTED, tags=tags))
    instance.report_engine_event(f"Executing steps in process (pid: {pid})", run,
                                 EngineEventData(metadata={"pid": dg.MetadataValue.int(pid)}))
    return run.run_id


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_runs_of_these_datacenters_or_of_none_whose_process_died_are_failed(tmp_path):
    """A run of no datacenter (the table checks, an aggregates refresh, table maintenance) left
    started by a killed deployment held its concurrency slot for good: no such run launched again."""
    with dg.DagsterInstance.ephemeral(tempdir=str(tmp_path)) as instance:
        dead = dead_pid()
        ours = started_run(instance, "join_clicks_job", {TAG_DC: "dc1"}, dead)
        deployment_wide = started_run(instance, "check_tables", {"photon/kind": "checks"}, dead)
        other_dc = started_run(instance, "join_clicks_job", {TAG_DC: "dc2"}, dead)
        alive = started_run(instance, "refresh_aggregates", {}, os.getpid())

        assert sorted(fail_dead_runs(instance, ["dc1"])) == sorted([ours, deployment_wide])
        status = {run_id: instance.get_run_by_id(run_id).status for run_id in (ours, deployment_wide, other_dc, alive)}
    assert status == {ours: dg.DagsterRunStatus.FAILURE, deployment_wide: dg.DagsterRunStatus.FAILURE,
                      other_dc: STARTED, alive: STARTED}
