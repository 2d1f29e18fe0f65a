"""`photon run` end to end, in subprocesses, against the generator's ground truth."""

import json
import os
import subprocess
import sys

import pytest
from deltalake import DeltaTable

from resources.state.layout import REPO_ROOT

pytestmark = pytest.mark.e2e
PHOTON = [sys.executable, "-m", "photon.cli"]


def photon(*args, env_extra=None, timeout=900) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_extra or {})}
    if "PHOTON_FAULT" not in (env_extra or {}):
        env.pop("PHOTON_FAULT", None)
    return subprocess.run([*PHOTON, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def run(data_dir, *extra, **kwargs) -> dict:
    result = photon("run", "--data-dir", str(data_dir), "--until-idle", "--json", *extra, **kwargs)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def gen(data_dir, *extra) -> dict:
    args = ["gen", "--data-dir", str(data_dir), "--queries", "2000", "--seed", "11", "--datacenters", "dc1,dc2", *extra]
    result = photon(*args)
    assert result.returncode == 0, result.stderr
    return json.loads((data_dir / "gen_summary.json").read_text())


def assert_matches_ground_truth(summary: dict, truth: dict):
    assert summary["clicks_seen"] == truth["click_lines"]
    assert summary["distinct_clicks"] == truth["distinct_click_ids"]
    assert summary["duplicate_click_lines"] == truth["duplicate_click_lines"]
    assert summary["clicks_joined"] == truth["joinable_clicks"]
    assert summary["clicks_pending"] == truth["distinct_click_ids"] - truth["joinable_clicks"]
    assert summary["clicks_unjoinable"] == 0
    assert summary["quarantined_lines"] == truth["bad_lines"]
    assert summary["failed_work_units"] == []
    assert all(summary["verification"].values()), summary["verification"]


def test_a_small_workload_end_to_end_reports_what_each_run_cost(tmp_path):
    """The quick tier's end-to-end run: one datacenter, every kind of bad line, duplicate lines, one
    photon run."""
    result = photon("gen", "--data-dir", str(tmp_path), "--queries", "300", "--seed", "5", "--datacenters", "dc1",
                    "--bad-lines", "12")
    assert result.returncode == 0, result.stderr
    truth = json.loads((tmp_path / "gen_summary.json").read_text())
    summary = run(tmp_path)
    assert_matches_ground_truth(summary, truth)
    for kind in ("query", "click", "aggregates"):
        cost = summary["run_cost"][kind]
        assert cost["runs"] >= 1 and cost["spark_jobs"] > 0 and cost["delta_commits"] >= 1, (kind, cost)
        assert cost["median_seconds"] > 0 and cost["phase_seconds"], (kind, cost)
        if kind != "aggregates":
            assert cost["median_launch_to_spark_seconds"] is not None, (kind, cost)
    # Both streams' watermarks: within the workload's event times, with their accuracy over the passes.
    config = truth["config"]
    newest = config["start_time_us"] + (config["span_seconds"] + config["click_delay_max_s"]) * 1e6
    for stream in ("query", "click"):
        mark = summary["watermarks"]["dc1"][stream]
        assert config["start_time_us"] <= mark["watermark_us"] <= newest, (stream, mark)
        assert 0.5 <= mark["accuracy"] <= 1 and mark["lag_seconds"] > 0, (stream, mark)


@pytest.fixture(scope="module")
def late_workload(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("late")
    return data_dir, gen(data_dir, "--withhold-late")


def test_late_queries_duplicates_replicas_and_reruns(late_workload, spark, over_spark_connect):
    """Over Spark Connect, as under `photon up` (the quick tier's end-to-end run is on a local session).
    A memory tier that holds nothing (a budget of one byte) and a durable tier of 20 s of event time:
    evictions run, and late queries are found in the raw logs through the log file map too
    (mapInArrow in the server's Python workers)."""
    data_dir, truth = late_workload
    assert truth["withheld_late_query_events"] > 0 and truth["duplicate_click_lines"] > 0
    settings = {"PHOTON_SETTINGS": json.dumps({"query_memory_bytes": 1, "query_cache_retention_seconds": 20,
                                             "query_cache_vacuum_retain_hours": 0})}

    # 1. Late queries withheld: their clicks stay pending; everything else is joined exactly once.
    first = run(data_dir, "--datacenters", "dc1", env_extra=settings)
    assert_matches_ground_truth(first, truth)
    assert first["clicks_pending"] == len(truth["late_click_ids"]) + truth["orphan_clicks"]
    assert {"clicks_seen", "distinct_clicks", "clicks_joined", "clicks_pending", "clicks_unjoinable",
            "duplicate_click_lines", "quarantined_lines", "runs", "wall_seconds"} <= set(first)

    # 2. The late query logs arrive: the pending clicks are retried and joined.
    truth = gen(data_dir, "--only-late")
    second = run(data_dir, "--datacenters", "dc1", env_extra=settings)
    assert_matches_ground_truth(second, truth)
    assert second["clicks_pending"] == truth["orphan_clicks"]
    assert second["runs"] >= 2  # the late query work unit and the pending retry
    assert second["event_store"]["logs_hits"] > 0, second["event_store"]
    # A Connect client has no status tracker: jobs are not counted, commits and phases are.
    click_cost = second["run_cost"]["click"]
    assert click_cost["spark_jobs"] is None and click_cost["delta_commits"] > 0 and click_cost["phase_seconds"]

    # 3. The second replica, same bytes: dc1 has stopped, so dc2 skips the ranges dc1 finished and
    # reads again only those dc1 left clicks pending in (nothing waits on a stopped datacenter);
    # every click there is already registered or still pending: nothing is added.
    replica = run(data_dir, "--datacenters", "dc2", env_extra=settings)
    assert replica["clicks_joined"] == second["clicks_joined"]
    assert all(replica["verification"].values())

    # The deltalake reader (an independent engine) agrees with Spark and with the invariants.
    joined_path = str(data_dir / "warehouse" / "joined_clicks")
    joined = DeltaTable(joined_path).to_pyarrow_table(columns=["click_id", "cost_micros", "joined_by_dc"])
    ids = joined.column("click_id").to_pylist()
    assert len(ids) == len(set(ids)) == truth["joinable_clicks"]
    assert set(ids) == set(truth["joinable_click_ids"])
    assert set(joined.column("joined_by_dc").to_pylist()) == {"dc1"}
    assert spark.read.format("delta").load(joined_path).count() == len(ids)
    aggregates = DeltaTable(str(data_dir / "warehouse" / "click_aggregates")).to_pyarrow_table()
    assert sum(aggregates.column("clicks").to_pylist()) == len(ids)
    assert sum(aggregates.column("cost_micros").to_pylist()) == sum(joined.column("cost_micros").to_pylist())
    quarantine = DeltaTable(str(data_dir / "warehouse" / "quarantined_lines")).to_pyarrow_table()
    assert len(set(zip(*quarantine.select(["stream", "file", "offset"]).to_pydict().values()))) == truth["bad_lines"]
    assert all(quarantine.column("reason").to_pylist())

    # Every asset check passes, over Connect too.
    checked = photon("check", "--data-dir", str(data_dir), "--json")
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert json.loads(checked.stdout.strip().splitlines()[-1])["passed"] is True


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--data-dir", "/nonexistent/photon", "--until-idle"], "does not exist"),
        (["run", "--data-dir", "."], "the following arguments are required: --until-idle"),
        (["run", "--data-dir", ".", "--until-idle", "--timeout-seconds", "soon"], "invalid float value"),
        (["gen", "--data-dir", "/tmp/x", "--queries", "-5"], "queries"),
        (["run", "--data-dir", ".", "--until-idle", "--spark-remote", "localhost:15002"],
         "--spark-remote 'localhost:15002' is not a Spark Connect address (sc://HOST:PORT)"),
    ],
)
def test_bad_invocations_fail_with_one_line(args, message):
    result = photon(*args, timeout=120)
    assert result.returncode != 0
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert message in result.stderr and result.stderr.startswith("photon: error:")


def test_unknown_datacenter_is_one_line(late_workload):
    data_dir, _ = late_workload
    result = photon("run", "--data-dir", str(data_dir), "--until-idle", "--datacenters", "dc9", timeout=120)
    assert result.returncode == 2 and result.stderr.strip() == (
        f"photon: error: --datacenters: unknown datacenter(s) dc9 under {data_dir / 'logs'}")
