"""Scale-out on an existing engine: the pipeline on a Spark standalone cluster (a master and two
workers on 127.0.0.1) behind the Spark Connect server; executors parse logs and call the registry
service themselves; the output is exactly once."""

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from pyspark.find_spark_home import _find_spark_home

from resources.spark.connect_server import SERVER_MARKER, free_port
from resources.state.layout import REPO_ROOT
from tests.conftest import start_spark_connect, stop_groups
from tests.e2e.test_photon_run import assert_matches_ground_truth, photon, run

pytestmark = pytest.mark.e2e
SPARK_CLASS = str(Path(_find_spark_home()) / "bin" / "spark-class")


def spawn(command: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    with open(log, "ab") as output:
        return subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=output, stderr=subprocess.STDOUT,
                                start_new_session=True)


def master_state(web_port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/json/", timeout=5) as answer:
        return json.load(answer)


def bound_ports(log: Path, deadline: float) -> tuple[int, int]:
    """The ports the master bound, from its log: a free port chosen here can be taken by another
    test's JVM before the master binds it, and Spark then moves on to the next port."""
    while True:
        text = log.read_text(errors="replace") if log.exists() else ""
        port = re.search(r"Starting Spark master at spark://127\.0\.0\.1:(\d+)", text)
        web_port = re.search(r"Bound MasterWebUI to .*? started at http://[^:]+:(\d+)", text)
        if port and web_port:
            return int(port.group(1)), int(web_port.group(1))
        assert time.monotonic() < deadline, f"the standalone master did not come up: {text[-2000:]}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A standalone master, two one-core workers, and a Spark Connect server whose master it is."""
    root = tmp_path_factory.mktemp("cluster")
    processes = [spawn([SPARK_CLASS, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                        "--port", str(free_port()), "--webui-port", str(free_port())], root / "master.log")]
    try:
        deadline = time.monotonic() + 120
        port, web_port = bound_ports(root / "master.log", deadline)
        for n in (1, 2):
            processes.append(spawn(
                [SPARK_CLASS, "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}", "--host",
                 "127.0.0.1", "--cores", "1", "--memory", "2g", "--webui-port", str(free_port()),
                 "--work-dir", str(root / f"worker{n}")], root / f"worker{n}.log"))
        while True:
            try:
                if master_state(web_port)["aliveworkers"] == 2:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the standalone cluster did not come up"
            time.sleep(1)
        server, remote = start_spark_connect(root / "spark-connect.log", "--master", f"spark://127.0.0.1:{port}",
                                             "--driver-memory", "2g")
        processes.append(server)
        yield remote, root, web_port
    finally:
        stop_groups(list(reversed(processes)))


def test_the_pipeline_on_a_standalone_cluster_joins_exactly_once(cluster, tmp_path):
    remote, root, web_port = cluster
    result = photon("gen", "--data-dir", str(tmp_path), "--queries", "1000", "--seed", "19", "--datacenters", "dc1")
    assert result.returncode == 0, result.stderr
    truth = json.loads((tmp_path / "gen_summary.json").read_text())

    summary = run(tmp_path, "--spark-remote", remote)
    assert_matches_ground_truth(summary, truth)

    # The work ran in both workers' executors (each keeps its executor's directory and log), for
    # the Connect server's application.
    apps = master_state(web_port)["activeapps"]
    assert [app["name"] for app in apps] == [SERVER_MARKER] and apps[0]["cores"] == 2
    executors = list(root.glob("worker*/app-*/*/stderr"))
    assert {path.parts[-4] for path in executors} == {"worker1", "worker2"}
    assert any("Finished task" in path.read_text(errors="replace") for path in executors)
