"""The pipeline on a Spark Connect server (resources/spark_connect.py) instead of an in-process
session: the same code, exactly-once output, every check passing."""

import json
import os
import signal
import subprocess

import pytest

from resources.layout import REPO_ROOT
from resources.spark_connect import free_port, wait_until_serving
from tests.e2e.test_photon_run import PHOTON, assert_matches_ground_truth, photon, run

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("connect") / "server.log", "wb")
    server = subprocess.Popen([*PHOTON, "spark-connect", "--port", str(port), "--driver-memory", "3g"], cwd=REPO_ROOT,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
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


def gen(data_dir, *extra) -> dict:
    args = ["gen", "--data-dir", str(data_dir), "--queries", "1000", "--seed", "13", "--datacenters", "dc1", *extra]
    result = photon(*args)
    assert result.returncode == 0, result.stderr
    return json.loads((data_dir / "gen_summary.json").read_text())


def test_late_queries_pending_clicks_and_cache_eviction_over_spark_connect(connect_server, tmp_path):
    # A cache tier of 20 s of event time: evictions run, and clicks are found through the log
    # file map in the raw logs too (mapInArrow in the server's Python workers).
    env = {"PHOTON_SETTINGS": json.dumps({"query_cache_retention_seconds": 20, "query_cache_vacuum_retain_hours": 0})}
    truth = gen(tmp_path, "--withhold-late")
    first = run(tmp_path, "--spark-remote", connect_server, env_extra=env)
    assert_matches_ground_truth(first, truth)
    assert first["clicks_pending"] == len(truth["late_click_ids"]) + truth["orphan_clicks"] > 0

    truth = gen(tmp_path, "--only-late")
    second = run(tmp_path, "--spark-remote", connect_server, env_extra=env)
    assert_matches_ground_truth(second, truth)
    assert second["clicks_pending"] == truth["orphan_clicks"]
    assert second["event_store"]["logs_hits"] > 0, second["event_store"]
    # A Connect client has no status tracker: jobs are not counted, commits and phases are.
    click_cost = second["run_cost"]["click"]
    assert click_cost["spark_jobs"] is None and click_cost["delta_commits"] > 0 and click_cost["phase_seconds"]

    checked = photon("check", "--data-dir", str(tmp_path), "--spark-remote", connect_server, "--json")
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert json.loads(checked.stdout.strip().splitlines()[-1])["passed"] is True


def test_a_bad_spark_remote_is_one_line(tmp_path):
    result = photon("run", "--data-dir", str(tmp_path), "--until-idle", "--spark-remote", "localhost:15002")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "photon: error: --spark-remote 'localhost:15002' is not a Spark Connect address (sc://HOST:PORT)"
    )
