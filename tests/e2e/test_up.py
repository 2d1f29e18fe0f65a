"""`photon up` end to end: the real registry service, Spark Connect server, dagster-daemon (one process
per run) and dagster-webserver, driving a generated workload to idle; then stopped, leaving no process."""

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import dagster as dg
import pytest
from deltalake import DeltaTable

from photon.run_processes import run_process, stat_fields
from photon.deployment import headless_instance
from photon_assets.work_unit import UNFINISHED
from resources.spark.connect_server import SERVER_MARKER, free_port
from resources.spark.session import SPARK_REMOTE_ENV
from resources.state.layout import REPO_ROOT, DataLayout
from spark_ops.tables import table_committed
from tests.e2e.test_photon_run import PHOTON, assert_matches_ground_truth, photon, run

pytestmark = pytest.mark.e2e
IDLE_TIMEOUT_SECONDS = 900


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`, found through /proc (components start process groups of
    their own, so a process group would not find them)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = stat_fields(int(stat.parent.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if (stat_fields(pid) or ["Z"])[0] != "Z"}


def wait_until_gone(pids: set[int], seconds: float) -> set[int]:
    """The processes of `pids` still alive after up to `seconds` (the kernel reaps killed groups)."""
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(pids)


def wait_for_output(data_dir: Path, truth: dict, up: subprocess.Popen) -> None:
    """Until every joinable click is joined and no run is unfinished, twice in a row 5 s apart."""
    joined_path = data_dir / "warehouse" / "joined_clicks"
    instance = headless_instance(DataLayout(data_dir))
    deadline = time.monotonic() + IDLE_TIMEOUT_SECONDS
    quiet, joined, unfinished = 0, 0, 0
    while quiet < 2:
        assert up.poll() is None, f"photon up exited with status {up.returncode}"
        assert time.monotonic() < deadline, (
            f"the daemon did not drive the workload to idle in time: {joined} of {truth['joinable_clicks']} "
            f"clicks joined, {unfinished} runs unfinished, runs by status "
            f"{ {s.value: instance.get_runs_count(dg.RunsFilter(statuses=[s])) for s in dg.DagsterRunStatus} }")
        time.sleep(5)
        joined = (
            sum(DeltaTable(str(joined_path)).get_add_actions(flatten=True).column("num_records").to_pylist())
            if table_committed(str(joined_path)) else 0
        )
        unfinished = instance.get_runs_count(dg.RunsFilter(statuses=[*UNFINISHED]))
        quiet = quiet + 1 if joined == truth["joinable_clicks"] and unfinished == 0 else 0


PIPELINE_JOBS = {"ingest_queries", "join_clicks_job"}


def start_up(data_dir: Path, env: dict[str, str], port: int | None = None, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    up = subprocess.Popen([*PHOTON, "up", "--data-dir", str(data_dir), "--port", str(port or free_port()), *extra], cwd=REPO_ROOT,
                          env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True)
    ready = up.stdout.readline()
    assert ready.startswith("photon up: http://127.0.0.1:"), (ready, up.stderr.read() if up.poll() else "")
    return up


def started_run(instance: dg.DagsterInstance, up: subprocess.Popen, not_in: set[str]) -> tuple[str, int]:
    """A pipeline run (not a table check, refresh or maintenance run) not in `not_in`, in the middle of its work (its
    process began 2 s ago: past its Dagster and Spark start, ~0.5 s; at 5 s, on 2026-11-30's faster
    machine, a run of this workload could end before one was seen); its id and pid."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert up.poll() is None, up.stderr.read()[-3000:]
        for started in instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])):
            process = run_process(instance, started.run_id)
            if (started.run_id not in not_in and started.job_name in PIPELINE_JOBS and process is not None
                    and time.time() - process[1] > 2):
                return started.run_id, process[0]
        time.sleep(0.2)
    raise AssertionError("no run started")


def component_pid(up: subprocess.Popen, name: str) -> int:
    """The pid of one of `photon up`'s components, by its command line."""
    for pid in descendants(up.pid):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if name in command and (stat_fields(pid) or [None, None])[1] == str(up.pid):
            return pid
    raise AssertionError(f"no {name} process under photon up")


def component_pid_or_none(up: subprocess.Popen, name: str) -> int | None:
    try:
        return component_pid(up, name)
    except AssertionError:
        return None


def killed_component_stops_up(up: subprocess.Popen, name: str, marker: str) -> None:
    running = descendants(up.pid)
    os.kill(component_pid(up, marker), signal.SIGKILL)
    assert up.wait(timeout=60) == 1
    assert up.stderr.read().strip().splitlines()[-1].startswith(f"photon: error: {name} exited with status ")
    assert wait_until_gone(running, 10) == set()


def test_photon_up_loses_nothing_to_killed_runs_and_components_then_stops_everything(tmp_path, spark_connect_server):
    """kill -9 of a run's process (photon up fails it; its work unit is retried), of the Spark
    Connect server in the middle of runs (photon up stops with a one-line error and is started
    again), and of photon up itself (the next photon up ends what it left running, and refuses a
    second photon up). That last one drives the workload to idle and stops on SIGTERM, leaving no
    process: the output is exactly the expected clicks. Its query tailer killed is restarted (the
    memory tier's offsets are the registry service's). The other components are watched by the
    same loop (photon/up.py: every component through runner.stop_if_exited), so killing each of them
    would repeat this; the registry service killed mid-run and restarted is
    tests/e2e/test_datacenters.py's."""
    result = photon("gen", "--data-dir", str(tmp_path), "--queries", "1000", "--seed", "13", "--datacenters", "dc1")
    assert result.returncode == 0, result.stderr
    truth = json.loads((tmp_path / "gen_summary.json").read_text())
    assert truth["late_query_events"] > 0 and truth["duplicate_click_lines"] > 0 and truth["bad_lines"] > 0
    # Small work units while faults are injected: many runs, so that each fault finds one under way.
    # The last photon up cuts the rest in the usual sizes.
    env = {"PHOTON_SETTINGS": json.dumps({"click_work_unit_bytes": 4000, "query_work_unit_bytes": 150_000,
                                          "click_catch_up_work_unit_bytes": 0, "query_catch_up_work_unit_bytes": 0})}
    seen: set[str] = set()

    up = start_up(tmp_path, env)
    instance = headless_instance(DataLayout(tmp_path))
    try:
        run_id, pid = started_run(instance, up, seen)
        seen.add(run_id)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while instance.get_run_by_id(run_id).status != dg.DagsterRunStatus.FAILURE:
            assert time.monotonic() < deadline, "the killed run was not marked failed"
            time.sleep(0.5)

        seen.add(started_run(instance, up, seen)[0])
        killed_component_stops_up(up, "spark-connect", SERVER_MARKER)

        up = start_up(tmp_path, env)
        run_id, _ = started_run(instance, up, seen)
        seen.add(run_id)
        left_behind = descendants(up.pid)
        up.kill()
        up.wait()
        port = free_port()
        up = start_up(tmp_path, {}, port)
        assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.FAILURE
        assert wait_until_gone(left_behind, 30) == set()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=10) as answer:
            assert answer.status == 200
        second = photon("up", "--data-dir", str(tmp_path), "--port", str(free_port()), timeout=120)
        assert second.returncode == 1
        assert second.stderr.strip() == f"photon: error: photon up is already running on {tmp_path} (pid {up.pid})"

        # The query tailer killed: photon up starts another, which goes on where the registry says.
        tailer = component_pid(up, "event-store tail")
        os.kill(tailer, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while component_pid_or_none(up, "event-store tail") in (None, tailer):
            assert time.monotonic() < deadline and up.poll() is None, "the query tailer was not restarted"
            time.sleep(0.2)

        wait_for_output(tmp_path, truth, up)
        running = descendants(up.pid)
        assert len(running) >= 5  # registry, query tailer, Spark Connect, daemon, webserver (and children)
    finally:
        stop_started = time.monotonic()
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
            try:
                up.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                raise
    assert up.returncode == 0, up.stderr.read()[-3000:]
    assert time.monotonic() - stop_started < 30
    assert alive(running) == set()

    # The daemon's runs, each a process of its own, wrote exactly the expected output: a photon run
    # on the same directory (over the suite's Connect server) finds nothing left to do, and verifies it.
    summary = run(tmp_path, env_extra={SPARK_REMOTE_ENV: spark_connect_server})
    assert_matches_ground_truth(summary, truth)
    daemon_runs = instance.get_run_records(dg.RunsFilter(statuses=[dg.DagsterRunStatus.SUCCESS]))
    assert {r.dagster_run.job_name for r in daemon_runs} >= PIPELINE_JOBS
    # Each daemon-launched run reports its start-up cost (the benchmarks compare it; no timing here).
    assert summary["run_cost"]["click"]["median_launch_to_spark_seconds"] is not None
    assert summary["run_cost"]["click"]["spark_jobs"] is None  # Connect clients: jobs not counted
