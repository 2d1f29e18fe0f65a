"""The run launcher `photon up`'s instance names (photon/run_server.py): loaded from the data
directory's dagster.yaml with the run server's socket, and the health check run monitoring asks it
for; and the Spark Connect session a run child releases when its run ends. A run forked by the real
server is tests/e2e/test_up.py's (its runs, killed and retried)."""

import os
import socket
import subprocess
import sys

import dagster as dg
import pytest
from dagster._core.events import EngineEventData
from dagster._core.launcher import WorkerStatus

from photon.dagster_internals import instance_at
from photon.run_server import ForkServerRunLauncher, private_directory
from photon.deployment import SOCKET_PATH_MAX_BYTES, prepare_environment, run_server_socket
from resources.spark.connect_server import free_port
from resources.state.layout import DataLayout


def test_the_data_directorys_instance_launches_runs_through_the_run_server(tmp_path, monkeypatch):
    layout = DataLayout(tmp_path)
    for name in ("DAGSTER_HOME", "PHOTON_DATA_DIR", "PHOTON_DATACENTERS", "PHOTON_RUN_LOG_LEVEL"):
        monkeypatch.setenv(name, os.environ.get(name, ""))
    prepare_environment(layout, ["dc1"], "INFO")
    launcher = instance_at(layout.dagster_home).run_launcher
    assert isinstance(launcher, ForkServerRunLauncher)
    assert launcher.socket_path == str(run_server_socket(layout))
    assert launcher.supports_check_run_worker_health


def test_a_data_directory_too_deep_for_a_socket_gets_its_run_server_a_private_socket_elsewhere(tmp_path):
    """A data directory under pytest's or a deep mount's path made `photon up`'s run server die on
    bind ("AF_UNIX path too long") and photon up stop before it served."""
    shallow, deep = DataLayout(tmp_path), DataLayout(tmp_path / ("d" * 60) / ("e" * 60))
    assert run_server_socket(shallow).is_relative_to(tmp_path)
    socket_path = run_server_socket(deep)
    assert not socket_path.is_relative_to(tmp_path) and len(os.fsencode(socket_path)) <= SOCKET_PATH_MAX_BYTES
    assert run_server_socket(DataLayout(tmp_path / ("d" * 60) / ("e" * 60))) == socket_path
    assert run_server_socket(DataLayout(tmp_path / ("d" * 60) / ("f" * 60))) != socket_path
    private_directory(socket_path.parent)
    assert socket_path.parent.stat().st_mode & 0o077 == 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(socket_path))
    socket_path.unlink()


def test_a_run_whose_process_is_gone_is_reported_failed_to_run_monitoring(tmp_path):
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        launcher = ForkServerRunLauncher(str(tmp_path / "none.sock"))
        launcher.register_instance(instance)
        run = instance.create_run_for_job(dg.GraphDefinition("g").to_job())
        assert launcher.check_run_worker_health(run).status == WorkerStatus.UNKNOWN
        child = subprocess.Popen([sys.executable, "-c", "pass"])
        instance.report_engine_event("Started process for run", run,
                                     engine_event_data=EngineEventData({"pid": str(child.pid)}))
        child.wait()
        assert launcher.check_run_worker_health(run).status == WorkerStatus.FAILED


def test_the_warm_run_server_holds_nothing_open_that_a_fork_would_share(tmp_path, monkeypatch):
    """The run server opens the instance once to import its storages, and closes it: no thread and
    no open file of the instance (its SQLite databases) is left for the forked runs to share."""
    layout = DataLayout(tmp_path)
    for name in ("DAGSTER_HOME", "PHOTON_DATA_DIR", "PHOTON_DATACENTERS", "PHOTON_RUN_LOG_LEVEL"):
        monkeypatch.setenv(name, os.environ.get(name, ""))
    prepare_environment(layout, ["dc1"], "INFO")
    instance_at(layout.dagster_home).dispose()  # the storages exist, as under `photon up`
    probe = ("import os, sys, threading; from photon.run_server import _warm_up; _warm_up(); fds = os.listdir('/proc/self/fd'); "
             "print(threading.active_count(), 'sqlalchemy' in sys.modules, "
             "[t for t in (os.path.realpath(f'/proc/self/fd/{fd}') for fd in fds) if t.startswith(os.environ['DAGSTER_HOME'])])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=os.environ, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "1 True []", out.stdout


RELEASED_PROBE = """
import sys
from pyspark.sql import SparkSession
from photon.run_server import release_spark_session
remote, release = sys.argv[1], sys.argv[2] == "release"
session = SparkSession.builder.remote(remote).getOrCreate()
session.range(3).collect()
if release:
    release_spark_session()
again = SparkSession.builder.remote(f"{remote}/;session_id={session.session_id}").create()
try:
    again.range(1).collect()
except Exception as error:
    print("refused:", str(error).splitlines()[0])
else:
    print("served")
"""


@pytest.mark.parametrize("release", [True, False])
def test_a_forked_runs_spark_session_is_released_on_the_server_when_it_ends(spark_connect_server, release):
    """What a run child does after its run (`release_spark_session`): its session's id is refused by the
    server from then on, where an unreleased one is still served."""
    probe = subprocess.run([sys.executable, "-c", RELEASED_PROBE, spark_connect_server,
                            "release" if release else "keep"], capture_output=True, text=True, timeout=300, check=False)
    assert probe.returncode == 0, probe.stderr[-2000:]
    answer = probe.stdout.strip().splitlines()[-1]
    if release:
        assert answer.startswith("refused:") and "SESSION_CLOSED" in answer, answer
    else:
        assert answer == "served", answer


GONE_PROBE = """
import sys, time
from pyspark.sql import SparkSession
from photon.run_server import release_spark_session
session = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
began = time.monotonic()
release_spark_session(float(sys.argv[2]))
print(f"released {time.monotonic() - began:.1f}")
"""


def test_a_run_child_whose_spark_connect_server_is_gone_exits_within_the_release_bound():
    """A run child whose server died with its `photon up` (killed by SIGKILL) gives the release one
    attempt within its bound: with the client's retries it lived ~10 minutes after its run ended."""
    probe = subprocess.run([sys.executable, "-c", GONE_PROBE, f"sc://127.0.0.1:{free_port()}", "5"],
                           capture_output=True, text=True, timeout=60, check=False)
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert float(probe.stdout.split()[-1]) < 5 + 2, probe.stdout


def test_a_run_child_whose_spark_connect_server_hangs_exits_at_the_release_bound():
    """A server that takes connections and never answers (stopped, or its machine unreachable): the
    release's one attempt would wait for good, so the run child waits for it only its bound, then
    exits with a warning, the session left to the server's idle timeout."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel accepts; nobody reads
        probe = subprocess.run([sys.executable, "-c", GONE_PROBE, f"sc://127.0.0.1:{silent.getsockname()[1]}", "3"],
                               capture_output=True, text=True, timeout=60, check=False)
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert 3 <= float(probe.stdout.split()[-1]) < 3 + 2, probe.stdout
    assert "was not released within 3 s" in probe.stderr, probe.stderr[-2000:]


def test_a_run_child_off_the_click_path_runs_at_the_lower_cpu_priority(tmp_path):
    """Each run is a process of its own: a click run keeps the server's priority, any other run (a
    query run, the refresh, maintenance, checks) is lowered before it starts. (In a new interpreter
    per run: a fork of the test's process, with its threads, is not what the run server forks.)"""
    from photon_assets.jobs import INGEST_QUERIES_JOB, JOIN_CLICKS_JOB
    from resources.runtime.priority import OFF_CLICK_PATH_NICE

    probe = ("import os, sys, dagster as dg; from photon.run_server import lower_if_off_click_path; "
             "instance = dg.DagsterInstance.get(); lower_if_off_click_path(instance.get_run_by_id(sys.argv[1])); "
             "print(os.getpriority(os.PRIO_PROCESS, 0))")
    base = os.getpriority(os.PRIO_PROCESS, 0)
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        runs = {name: instance.create_run_for_job(dg.GraphDefinition(name).to_job()).run_id
                for name in (JOIN_CLICKS_JOB, INGEST_QUERIES_JOB, "maintain_tables")}
        env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
        nice = {name: int(subprocess.run([sys.executable, "-c", probe, run_id], env=env, capture_output=True,
                                         text=True, check=True).stdout.split()[-1])
                for name, run_id in runs.items()}
    lowered = max(base, OFF_CLICK_PATH_NICE)
    assert nice == {JOIN_CLICKS_JOB: base, INGEST_QUERIES_JOB: lowered, "maintain_tables": lowered}
