"""Fault injection: `photon run` killed (SIGKILL) at each crash point of the join in turn, then failing
by an exception, then run to the end. The result must be exactly the clean run's (docs/CONTRACTS.md,
invariant 3), reached by the retries alone: no recovery was needed."""

import json
import signal

import pytest

from resources.runtime.faults import fault_marker
from spark_ops.join import CRASH_POINTS
from tests.e2e.test_photon_run import assert_matches_ground_truth, photon, run

pytestmark = [pytest.mark.e2e, pytest.mark.faults, pytest.mark.usefixtures("over_spark_connect")]


def test_crash_at_each_point_in_turn_then_rerun_equals_clean_run(tmp_path):
    result = photon("gen", "--data-dir", str(tmp_path), "--queries", "1500", "--seed", "5")
    assert result.returncode == 0, result.stderr
    truth = json.loads((tmp_path / "gen_summary.json").read_text())
    state = tmp_path / "state"

    # Each run is killed where the work unit it reaches (the last crash's retry, or the next one) is.
    for point in CRASH_POINTS:
        killed = photon("run", "--data-dir", str(tmp_path), "--until-idle", env_extra={"PHOTON_FAULT": f"{point}:kill"})
        assert killed.returncode == -signal.SIGKILL, (point, killed.stderr[-2000:])
        assert fault_marker(state, point, "kill").exists()

    # A raised failure is retried by the dispatcher within the same `photon run`.
    summary = run(tmp_path, env_extra={"PHOTON_FAULT": "after_registry_commit:raise"})
    assert fault_marker(state, "after_registry_commit", "raise").exists()
    assert_matches_ground_truth(summary, truth)
    assert summary["recoveries"] == [], summary["recoveries"]
