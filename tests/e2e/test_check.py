"""`photon check` end to end, in subprocesses: every asset check through Dagster, recorded in the
data directory's instance. One workload is generated and run once for the whole module, by a `photon
run` over the suite's Spark Connect server (tests/conftest.py); `photon check` itself uses no Spark."""

import fcntl
import json
import shutil

import dagster as dg
import pytest
from deltalake import DeltaTable, write_deltalake

from photon.deployment import headless_instance
from photon_assets.checks import ALL_CHECKS
from resources.spark.session import SPARK_REMOTE_ENV
from resources.state.layout import DataLayout
from tests.e2e.test_photon_run import photon, run

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def workload(tmp_path_factory, spark_connect_server):
    """A data directory after one `photon run` (not to be modified: copy it first)."""
    data_dir = tmp_path_factory.mktemp("check")
    result = photon("gen", "--data-dir", str(data_dir), "--queries", "300", "--seed", "7", "--datacenters", "dc1")
    assert result.returncode == 0, result.stderr
    summary = run(data_dir, env_extra={SPARK_REMOTE_ENV: spark_connect_server})
    assert all(summary["verification"].values()), summary["verification"]
    return data_dir


def check(data_dir, *extra, timeout=900):
    return photon("check", "--data-dir", str(data_dir), *extra, timeout=timeout)


def test_every_check_passes_and_is_recorded_in_the_instance(workload):
    result = check(workload, "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["passed"] is True
    assert [c["name"] for c in outcome["checks"]] == [c.check_key.name for c in ALL_CHECKS]
    assert all(c["passed"] for c in outcome["checks"]), outcome
    unique = next(c for c in outcome["checks"] if c["name"] == "joined_clicks_unique")
    assert unique["asset"] == "joined_clicks"
    assert unique["metadata"]["duplicate_rows"] == 0 and unique["metadata"]["distinct_click_ids"] > 0
    assert "photon: check failed" not in result.stderr

    # Through Dagster: the run and each check's evaluation are in the data directory's instance.
    with headless_instance(DataLayout(workload)) as instance:
        recorded = instance.get_run_by_id(outcome["run_id"])
        assert recorded.status == dg.DagsterRunStatus.SUCCESS and recorded.tags["photon/kind"] == "check"
        for definition in ALL_CHECKS:
            latest = instance.event_log_storage.get_asset_check_execution_history(definition.check_key, limit=1)
            assert latest[0].run_id == outcome["run_id"]


def test_a_duplicate_written_by_another_writer_fails_the_check(workload, tmp_path):
    data_dir = tmp_path / "data"
    shutil.copytree(workload, data_dir, symlinks=True)
    joined = str(data_dir / "warehouse" / "joined_clicks")
    write_deltalake(joined, DeltaTable(joined).to_pyarrow_table().slice(0, 1), mode="append")

    result = check(data_dir)
    assert result.returncode == 1, result.stderr[-3000:]
    failed = [line for line in result.stderr.splitlines() if line.startswith("photon: check failed: ")]
    unique = [line for line in failed if line.startswith("photon: check failed: joined_clicks_unique (joined_clicks):")]
    assert len(unique) == 1, result.stderr[-3000:]
    assert "duplicate_rows=1" in unique[0].split(": ", 3)[3].split(", ")
    assert "registry_matches_output" not in "\n".join(failed)  # nothing lost, only duplicated


def test_refused_while_a_photon_run_owns_the_datacenter(workload):
    locks = workload / "state" / "locks"
    with open(locks / "dc1.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = check(workload, timeout=300)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"photon: error: another photon run is running datacenter dc1 of {workload}"]


def test_refused_while_photon_up_owns_the_datacenter_and_says_where_its_checks_run(workload):
    """As `photon up` holds them: its lock with its pid, and the datacenter's."""
    locks = workload / "state" / "locks"
    with open(locks / "up.lock", "a+") as up, open(locks / "dc1.lock", "a") as dc:
        fcntl.flock(up, fcntl.LOCK_EX)
        up.truncate(0)
        up.write("4242")
        up.flush()
        fcntl.flock(dc, fcntl.LOCK_EX)
        result = check(workload, timeout=300)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"photon: error: photon up (pid 4242) is running datacenter dc1 of {workload}: "
                           "it runs these checks itself (the check_tables job"), line


@pytest.mark.parametrize("layout", ["missing", "empty"])
def test_nothing_to_check_is_one_line(tmp_path, layout):
    data_dir = tmp_path / "nonexistent" if layout == "missing" else tmp_path
    result = check(data_dir, timeout=120)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("photon: error: nothing to check: ")
    if layout == "missing":
        assert f"data directory {data_dir} does not exist" in result.stderr
    else:
        assert "run photon run first" in result.stderr
