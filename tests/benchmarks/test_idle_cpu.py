"""The idle CPU benchmark's measure (benchmarks/idle_cpu.py): each process's time in the window, a
process that exits in the window included."""

import subprocess
import sys

from benchmarks.idle_cpu import measure

# Waits for its stdin to close, then runs a child that burns 0.5 s of CPU and exits, and reaps it.
PARENT = """
import subprocess, sys
sys.stdin.read()
subprocess.run([sys.executable, "-c", "import time\\nend = time.process_time() + 0.5\\nwhile time.process_time() < end: pass"])
sys.stdin = None
import time; time.sleep(600)
"""


def test_a_child_that_exits_in_the_window_counts_in_its_parents_component():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE)
    try:
        parent.stdin.close()  # the child starts now, inside the window below
        components = measure(parent.pid, window_s=8.0)  # room for the child under load
    finally:
        parent.kill()
        parent.wait()
    [(name, row)] = components.items()
    assert name == "photon up"  # the root, by position
    assert 0.45 / 8 <= row["core_share"] <= 1.0 / 8, row
