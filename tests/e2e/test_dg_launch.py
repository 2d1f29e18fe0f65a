"""`dg launch --assets joined_clicks` on a generated workload: one key of the join_clicks multi-asset selected
from the command line runs the pass (a catch-up work unit of the first datacenter's lines), which records the
three tables it writes, and its blocking checks are in the instance."""

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from photon.dagster_internals import instance_at
from resources.state.layout import REPO_ROOT
from photon_assets.checks import WORK_UNIT_CHECK_SPECS
from tests.e2e.test_photon_run import photon

pytestmark = pytest.mark.e2e
DG = Path(sys.executable).parent / "dg"


def test_dg_launch_materializes_joined_clicks_with_its_checks(tmp_path):
    data_dir = tmp_path / "data"
    generated = photon("gen", "--data-dir", str(data_dir), "--queries", "200", "--seed", "3", "--datacenters", "dc1")
    assert generated.returncode == 0, generated.stderr
    (data_dir / "dagster").mkdir()
    env = {**os.environ, "PHOTON_DATA_DIR": str(data_dir), "DAGSTER_HOME": str(data_dir / "dagster")}
    env.pop("PHOTON_SPARK_REMOTE", None)  # its own local Spark session, as a data engineer's laptop has
    launched = subprocess.run([str(DG), "launch", "--assets", "joined_clicks"], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=600)
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]

    instance = instance_at(data_dir / "dagster")
    [run] = instance.get_runs()
    assert run.status == dg.DagsterRunStatus.SUCCESS and run.asset_selection == {dg.AssetKey("joined_clicks")}
    for key in ("click_ledger", "joined_clicks", "unjoinable_clicks"):  # the pass wrote and recorded all three
        event = instance.get_latest_materialization_event(dg.AssetKey(key))
        assert event is not None and event.run_id == run.run_id, key
    ledger = instance.get_latest_materialization_event(dg.AssetKey("click_ledger")).asset_materialization
    truth = json.loads((data_dir / "gen_summary.json").read_text())
    assert ledger.metadata["dagster/row_count"].value == truth["distinct_click_ids"]  # the catch-up unit: every line
    for spec in WORK_UNIT_CHECK_SPECS:
        [record] = instance.event_log_storage.get_asset_check_execution_history(spec.key, limit=1)
        assert record.run_id == run.run_id and record.status.value == "SUCCEEDED", spec.name
