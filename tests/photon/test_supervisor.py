"""The one supervisor of child processes (photon/supervisor.py), with real processes and signals."""

import logging
import os
import signal
import sys
import threading
import time
from dataclasses import replace

import pytest

from photon.deployment import RunnerError
from photon.supervisor import FATAL, Restart, Spec, Supervisor

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
QUICKLY_RESTARTED = Restart(True, backoff_seconds=0.2, max_backoff_seconds=0.4, healthy_seconds=60.0)


def spec(tmp_path, name: str, restart: Restart = QUICKLY_RESTARTED, stop_rank: int = 0) -> Spec:
    return Spec(name, f"the {name}", SLEEPER, tmp_path / f"{name}.log", restart, stop_rank)


def wait_until(condition, seconds: float = 20.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.05)


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def exec_done(pid: int) -> bool:
    """setpriv has exec'd the command: the parent-death signal is set from then on."""
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return cmdline.read().split(b"\0")[:3] == [arg.encode() for arg in SLEEPER[:3]]


def test_a_restarted_component_comes_back_and_a_fatal_one_stops_with_one_line(tmp_path):
    with Supervisor(logging.getLogger("test")) as supervisor:
        tailer = supervisor.start(spec(tmp_path, "tailer"))
        registry = supervisor.start(replace(spec(tmp_path, "registry", FATAL), exit_hint="state is kept; "))
        os.kill(tailer.process.pid, signal.SIGKILL)
        wait_until(lambda: supervisor.watch() is None and supervisor.pid("tailer") not in (None, tailer.process.pid))
        assert supervisor.children["tailer"].exits == [-signal.SIGKILL]
        os.kill(registry.process.pid, signal.SIGKILL)
        registry.process.wait(10)
        with pytest.raises(RunnerError, match=r"the registry exited with status -9; state is kept; see .*registry\.log"):
            supervisor.watch()
        restarted = supervisor.pid("tailer")
    assert not running(restarted)  # leaving the block stops what is left


def test_a_child_restarted_from_a_thread_outlives_that_thread(tmp_path):
    """The kernel's parent-death signal follows the thread that forked a child: `photon run` restarts
    etcd members and replicas from its click passes' thread, which ends before the registry stops."""
    with Supervisor(logging.getLogger("test")) as supervisor:
        member = supervisor.start(spec(tmp_path, "etcd-1"))
        os.kill(member.process.pid, signal.SIGKILL)

        def watch_until_restarted() -> None:
            wait_until(lambda: supervisor.watch() is None and supervisor.pid("etcd-1") not in (None, member.process.pid))
            wait_until(lambda: exec_done(supervisor.pid("etcd-1")))  # setpriv has set the signal up

        passes = threading.Thread(target=watch_until_restarted)
        passes.start()
        passes.join()
        restarted = supervisor.pid("etcd-1")
        time.sleep(1.0)  # a parent-death SIGTERM would have landed by now
        assert running(restarted)
        assert supervisor.pid("etcd-1") == restarted


def test_stop_goes_by_stop_rank(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="test")
    with Supervisor(logging.getLogger("test")) as supervisor:
        registry = supervisor.start(spec(tmp_path, "registry", FATAL, stop_rank=9))
        daemon = supervisor.start(spec(tmp_path, "daemon", FATAL, stop_rank=0))
        supervisor.stop()
        assert registry.process.returncode is not None and daemon.process.returncode is not None
        assert supervisor.children == {}
    assert [r.getMessage() for r in caplog.records] == ["stopping daemon", "stopping registry"]
