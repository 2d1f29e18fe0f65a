"""One Spark Connect server for the end-to-end tests that opt in (`over_spark_connect`): each
`photon run` they start is then a client of a warm JVM, as a daemon's run is under `photon up`,
instead of starting and warming a JVM of its own. Also how the tests start and stop such a server
(tests/e2e/test_cluster.py starts one on a standalone cluster)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from resources.layout import REPO_ROOT
from resources.spark import SPARK_REMOTE_ENV
from resources.spark_connect import free_port, server_environment, wait_until_serving

STOP_SECONDS = 30


def stop_groups(processes: list[subprocess.Popen]) -> None:
    """SIGTERM to each process's group, in the order given; SIGKILL to a group still there after 30 s."""
    for process in processes:
        os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def start_spark_connect(log: Path, *options: str) -> tuple[subprocess.Popen, str]:
    """`photon spark-connect` in a process group of its own, once it serves; and its address."""
    port = free_port()
    with open(log, "ab") as output:
        server = subprocess.Popen([sys.executable, "-m", "photon.cli", "spark-connect", "--port", str(port), *options],
                                  cwd=REPO_ROOT, env=server_environment(), stdout=output, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    remote = f"sc://127.0.0.1:{port}"
    try:
        wait_until_serving(remote, server)
    except BaseException:
        stop_groups([server])
        raise
    return server, remote


@pytest.fixture(scope="session")
def spark_connect_server(tmp_path_factory):
    server, remote = start_spark_connect(tmp_path_factory.mktemp("connect") / "server.log", "--driver-memory", "4g")
    try:
        yield remote
    finally:
        stop_groups([server])


@pytest.fixture
def over_spark_connect(spark_connect_server, monkeypatch):
    """The test's `photon` commands run over the shared Connect server (PHOTON_SPARK_REMOTE)."""
    monkeypatch.setenv(SPARK_REMOTE_ENV, spark_connect_server)
    return spark_connect_server
