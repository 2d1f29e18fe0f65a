"""One Spark Connect server for the end-to-end tests that opt in (`over_spark_connect`): each
`photon run` they start is then a client of a warm JVM, as a daemon's run is under `photon up`,
instead of starting and warming a JVM of its own."""

import os
import signal
import subprocess
import sys

import pytest

from resources.layout import REPO_ROOT
from resources.spark import SPARK_REMOTE_ENV
from resources.spark_connect import free_port, wait_until_serving


@pytest.fixture(scope="session")
def spark_connect_server(tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("connect") / "server.log", "wb")
    server = subprocess.Popen([sys.executable, "-m", "photon.cli", "spark-connect", "--port", str(port),
                               "--driver-memory", "4g"], cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    remote = f"sc://127.0.0.1:{port}"
    try:
        wait_until_serving(remote, server)
        yield remote
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


@pytest.fixture
def over_spark_connect(spark_connect_server, monkeypatch):
    """The test's `photon` commands run over the shared Connect server (PHOTON_SPARK_REMOTE)."""
    monkeypatch.setenv(SPARK_REMOTE_ENV, spark_connect_server)
    return spark_connect_server
