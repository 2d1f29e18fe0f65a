"""Stopping a long-lived component started in a process group of its own (`photon up`'s components,
the chaos tool's deployment, the tests' servers): the group holds what the component started too
(Spark's JVM, a run server's forked runs), which a signal to the component alone would leave behind."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_group(process: subprocess.Popen, seconds: float) -> None:
    """SIGTERM to the process's group; after up to `seconds` for the process to exit, SIGKILL to what
    of the group is left (a child can outlive its parent's clean exit); then the process is reaped."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
