"""Fault injection: `photon run` killed (SIGKILL) or failing at each crash point of the join, then
run again. The result must be exactly the clean run's (docs/CONTRACTS.md, invariant 3)."""

import json
import signal

import pytest

from tests.e2e.test_photon_run import assert_matches_ground_truth, photon, run

pytestmark = [pytest.mark.e2e, pytest.mark.faults]


@pytest.mark.parametrize(
    "fault",
    ["before_registry_commit:kill", "after_registry_commit:kill", "after_output_write:kill", "after_registry_commit:raise"],
)
def test_crash_at_each_point_then_rerun_equals_clean_run(tmp_path, fault):
    result = photon("gen", "--data-dir", str(tmp_path), "--queries", "1500", "--seed", "5")
    assert result.returncode == 0, result.stderr
    truth = json.loads((tmp_path / "gen_summary.json").read_text())

    if fault.endswith(":kill"):
        killed = photon("run", "--data-dir", str(tmp_path), "--until-idle", env_extra={"PHOTON_FAULT": fault})
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        summary = run(tmp_path)
    else:
        # A raised failure is retried by the dispatcher within the same `photon run`.
        summary = run(tmp_path, env_extra={"PHOTON_FAULT": fault})
    assert (tmp_path / "state" / "faults" / fault.split(":")[0]).exists()
    assert_matches_ground_truth(summary, truth)
