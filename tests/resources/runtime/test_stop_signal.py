"""A graceful stop that Dagster's in-process runs cannot swallow (resources/runtime/stop_signal.py), with
real signals to a real process."""

import signal
import subprocess
import sys

from resources.state.layout import REPO_ROOT

# A body that, like `photon run`'s drain, executes each "run" inside Dagster's `capture_interrupts` (on
# the main thread it would take the SIGINT for itself) and checks the stop event between runs. It
# prints "running" once inside a run; `IGNORE_STOP` makes it never look at the event.
BODY = """
import logging, sys, time
from dagster._utils.interrupts import capture_interrupts
from resources.runtime.stop_signal import run_stoppable

def drain(stop):
    passes = 0
    while not stop.is_set() or IGNORE_STOP:
        with capture_interrupts():
            print("running", flush=True)
            time.sleep(1.0)
        passes += 1
    return passes

try:
    print("passes", run_stoppable(drain, logging.getLogger("test"), "drain"), flush=True)
except KeyboardInterrupt:
    print("at once", flush=True)
    sys.exit(130)
"""


def stoppable(ignore_stop: bool) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", f"IGNORE_STOP = {ignore_stop}\n{BODY}"], cwd=REPO_ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "running\n"
    return process


def test_a_signal_during_a_run_ends_the_body_after_that_run():
    process = stoppable(ignore_stop=False)
    process.send_signal(signal.SIGINT)  # while the body is inside capture_interrupts
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert out.splitlines()[-1] == "passes 1"
    assert "stopping after the pass under way" in err


def test_a_second_signal_stops_at_once():
    process = stoppable(ignore_stop=True)
    process.send_signal(signal.SIGTERM)
    assert process.stdout.readline() == "running\n"  # the first one only asked
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=30)
    assert (process.returncode, out.splitlines()[-1]) == (130, "at once"), err
