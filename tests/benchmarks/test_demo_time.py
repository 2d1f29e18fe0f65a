"""The demo's time split into phases by its log's timestamps (benchmarks/demo_time.py)."""

from datetime import datetime

import pytest

from benchmarks.demo_time import phases

pytestmark = pytest.mark.benchmarks


def test_the_demos_phases_come_from_its_log_timestamps():
    started = datetime(2026, 12, 7, 9, 0, 0).timestamp()
    log = "\n".join(["WARNING: Using incubator modules",
                     "2026-12-07 09:00:01,500 INFO local registry service at 127.0.0.1:1",
                     "2026-12-07 09:00:12,000 INFO pass launched 2 run(s); 2 run(s) so far",
                     "26/12/07 09:00:13 WARN a Spark line",
                     "2026-12-07 09:00:20,250 INFO pass launched 1 run(s); 3 run(s) so far"])
    assert phases(log, started, 27.0) == {"to_registry_seconds": 1.5, "to_first_pass_with_runs_done_seconds": 12.0,
                                          "first_to_last_pass_with_runs_seconds": 8.25, "after_last_pass_with_runs_seconds": 6.75,
                                          "passes_with_runs": 2}
    assert phases("", started, 27.0)["passes_with_runs"] == 0
