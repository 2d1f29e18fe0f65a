"""The process behind a Dagster run. Dagster's default run launcher starts each run in a process of
its own, which logs its pid in an engine event; no Dagster API says whether that process still lives,
so it is read from /proc, with the process's start time so that a reused pid is not taken for it."""

from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path

import dagster as dg

KILL_WAIT_SECONDS = 10.0


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name: [state, ppid, pgrp, ...]; None if there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def run_process(instance: dg.DagsterInstance, run_id: str) -> tuple[int, float] | None:
    """The pid a run's process logged when it began (Dagster's engine event with a `pid`), and when."""
    events = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT).records
    for record in events:
        metadata = record.event_log_entry.dagster_event.engine_event_data.metadata
        if "pid" in metadata:
            return int(metadata["pid"].value), record.event_log_entry.timestamp
    return None


@functools.cache
def boot_time() -> float:
    return next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                if line.startswith("btime "))


def process_alive_since(pid: int, since: float) -> bool:
    """Whether process `pid` lives (not a zombie) and started by `since` (not a reused pid)."""
    fields = stat_fields(pid)
    if fields is None or fields[0] == "Z":
        return False
    started = boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return started <= since + 1.0


def kill_run_process(instance: dg.DagsterInstance, run_id: str) -> int | None:
    """SIGKILLs the run's process if it still lives, and waits until it is gone: a run left behind by
    a deployment that died (its run processes outlive the daemon) must not write while its work unit
    is retried. Returns the pid killed, if any."""
    process = run_process(instance, run_id)
    if process is None or not process_alive_since(*process):
        return None
    pid, since = process
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return None
    deadline = time.monotonic() + KILL_WAIT_SECONDS
    while process_alive_since(pid, since) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pid
