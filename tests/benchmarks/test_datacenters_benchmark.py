"""`benchmarks/datacenters.py`'s live outage, small: dc2 down while its logs keep arriving, then back;
its catch-up is measured, and the output is every joinable click once. (Not test_datacenters.py:
tests/e2e has one, and test modules share one namespace here.)"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.benchmarks
def test_a_datacenter_back_from_a_live_outage_catches_up_exactly_once(tmp_path):
    # dc1 takes dc2's share over 10 s after dc2's lease lapses, as in a real outage (after 120 s).
    env = {**os.environ, "PHOTON_SETTINGS": json.dumps({"takeover_grace_seconds": 10})}
    done = subprocess.run([sys.executable, "benchmarks/datacenters.py", "--parts", "live-outage", "--rate", "50",
                           "--outage-after", "20", "--outage-seconds", "40", "--after-seconds", "10",
                           "--results-dir", str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (written,) = tmp_path.glob("*-datacenters-live-outage-*.json")
    outage = json.loads(written.read_text())["live_outage"]
    assert outage["no_click_twice"] and outage["every_joinable_click_joined"], outage
    # 40 s of logs at 50 clicks/s, less the lines still in dc1's files when dc2 looked.
    assert 1000 <= outage["backlog_clicks"] <= 2600, outage
    assert outage["catch_up_seconds"] > 0 and outage["catch_up_rate_multiple"] > 0
    assert [row["dc"] for row in outage["datacenters"]] == ["dc1", "dc2"]
