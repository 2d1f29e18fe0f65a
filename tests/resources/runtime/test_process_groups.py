"""Stopping a component's whole process group (resources/runtime/process_groups.py)."""

import os
import subprocess
import sys
import time

from resources.runtime.process_groups import stop_group

# A leader that exits on SIGTERM, and a child of it that ignores SIGTERM (as a JVM busy in a
# shutdown hook might): the child's pid is printed once it ignores the signal.
LEADER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"],
    stdout=subprocess.PIPE, text=True)
assert child.stdout.readline() == "ready\\n"
print(child.pid, flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"


def test_what_of_the_group_outlives_its_leader_is_killed():
    leader = subprocess.Popen([sys.executable, "-c", LEADER], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    child = int(leader.stdout.readline())
    stop_group(leader, seconds=10)
    assert leader.returncode is not None
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)  # SIGKILL is delivered; the orphan is reaped by init
    assert not alive(child)


def test_a_group_already_gone_is_only_reaped():
    process = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    while alive(process.pid):
        time.sleep(0.01)  # exited, not reaped yet
    stop_group(process, seconds=1)
    assert process.returncode == 0
