"""The query tailers of a deployment's datacenters (photon/query_tail.py), as child processes that
`photon run` and `photon up` start once the registry service is up and restart when one exits: the
memory tier they feed lives in the registry service, and a tailer resumes from the offsets recorded
there, so a restart costs a second of tailing and correctness never depends on it (unlike the
registry service, whose exit stops the deployment)."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from resources.state.layout import REPO_ROOT, DataLayout


# Set in a tailer's environment to its parent's pid: the tailer asks the kernel for SIGTERM when that
# process dies (even by SIGKILL), itself, so that no `preexec_fn` runs while the parent has threads.
PARENT_PID_ENV = "PHOTON_TAILER_PARENT_PID"


def tailer_log(layout: DataLayout, dc: str) -> Path:
    return layout.root / "state" / f"query_tail_{dc}.log"


def die_with_parent_named_in_env() -> None:
    """In a tailer: SIGTERM once the parent named by PARENT_PID_ENV dies (Linux prctl); exits at once
    if it is already gone."""
    parent = os.environ.get(PARENT_PID_ENV)
    if not parent:
        return
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != int(parent):
        sys.exit(0)


class QueryTailers:
    """One `photon event-store tail` process per datacenter, each a process group of its own (so a
    signal to the caller's group does not stop it before the runs that use its memory tier), which
    ends when its parent dies (PARENT_PID_ENV)."""

    def __init__(self, layout: DataLayout, datacenters: list[str], log: logging.Logger, settings_json: str):
        self.layout, self.datacenters, self.log, self.settings_json = layout, datacenters, log, settings_json
        self.processes: dict[str, subprocess.Popen] = {}
        self.restarts = 0

    def _start(self, dc: str) -> subprocess.Popen:
        log_path = tailer_log(self.layout, dc)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as output:
            return subprocess.Popen(
                [sys.executable, "-m", "photon.cli", "event-store", "tail", "--data-dir", str(self.layout.root),
                 "--datacenter", dc, "--settings", self.settings_json],
                stdout=output, stderr=output, cwd=REPO_ROOT, start_new_session=True,
                env={**os.environ, PARENT_PID_ENV: str(os.getpid())},
            )

    def start(self) -> "QueryTailers":
        for dc in self.datacenters:
            self.processes[dc] = self._start(dc)
        return self

    def watch(self) -> None:
        """Restarts each tailer that exited, with a warning naming its exit status and log."""
        for dc, process in list(self.processes.items()):
            if process.poll() is not None:
                self.log.warning("the query tailer of %s exited with status %s; restarting it (see %s)", dc,
                                 process.returncode, tailer_log(self.layout, dc))
                self.restarts += 1
                self.processes[dc] = self._start(dc)

    def pids(self) -> dict[str, int]:
        return {dc: process.pid for dc, process in self.processes.items()}

    def stop(self, timeout_seconds: float = 10.0) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + timeout_seconds
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
