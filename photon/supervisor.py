"""One supervisor for every child process of `photon run`, `photon up` and `photon registry serve
--replicas`: it starts a component (with its log file), waits until it is ready, watches it, restarts
it or stops the deployment by the component's policy, and stops every component in order.

What each component is (its command, readiness, policy, stop order) is a row of photon/components.py.
Every child is started here and nowhere else (`start`): a process group of its own (a signal to the
caller's group, a terminal's Ctrl-C or systemd's stop, reaches the caller alone, which stops its
children in order; a component's own children, such as a run server's forked runs, share its group
and stop with it), stdin closed, stdout and stderr appended to its log, and `setpriv --pdeathsig
SIGTERM` in front of its command: the kernel signals it when this process dies, even by SIGKILL.
Linux ties that signal to the *thread* that forked the child, so every fork runs on the supervisor's own
spawning thread, which lives until every child is stopped: a restart from a caller's thread that ends
earlier (`photon run`'s click passes, resources/runtime/stop_signal.py) would otherwise SIGTERM the
restarted etcd members and replicas the moment that thread ends, with the others still up.

Policies (`Restart`): FATAL, the component's exit stops the deployment with one line naming it and
its log (a deployment that heals silently hides a crash loop: Spark, the registry of one machine,
Dagster's processes); RESTARTED, started again after a backoff that doubles from `backoff_seconds`
up to `max_backoff_seconds` and is reset once it ran `healthy_seconds` (what resumes from state kept
elsewhere: the query tailers, the replicated registry's etcd members and replicas).
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from photon.deployment import RunnerError
from resources.runtime.process_groups import stop_group
from resources.state.layout import REPO_ROOT

PDEATHSIG = ["setpriv", "--pdeathsig", "SIGTERM", "--"]


@dataclass(frozen=True)
class Restart:
    restart: bool
    backoff_seconds: float = 1.0
    max_backoff_seconds: float = 30.0
    healthy_seconds: float = 60.0


FATAL = Restart(False)
RESTARTED = Restart(True)


class Readiness(Protocol):
    """When a started component serves: `ready()` is polled until it says so."""

    what: str

    def ready(self) -> bool: ...


@dataclass(frozen=True)
class Spec:
    """One component as it is started: a row of photon/components.py filled in for a deployment."""

    name: str  # unique in the deployment, e.g. "query-tailer-dc1"
    title: str  # how lines name it, e.g. "the query tailer of dc1"
    command: list[str]
    log: Path
    restart: Restart
    stop_rank: int  # lower stops first
    stop_seconds: float = 2.0  # from SIGTERM to SIGKILL of what is left of its process group
    ready: Readiness | None = None
    ready_seconds: float = 60.0
    # A FATAL component that exits before it is ready is started again until ready_seconds have
    # passed (the local registry: a server of a run that just died may still hold its files).
    retry_until_ready: bool = False
    env: dict[str, str] | None = None
    # Said in the line that reports its exit, before "see <log>" (e.g. "state is kept, run again").
    exit_hint: str = ""
    # Called before each start, restarts included (e.g. an etcd member whose directory is gone is
    # replaced in the cluster before it starts again).
    before_start: Callable[[], None] | None = None
    # The command made anew at each start, when its flags depend on state (an etcd member joins an
    # existing cluster once the cluster was formed).
    fresh_command: Callable[[], list[str]] | None = None


@dataclass
class Child:
    spec: Spec
    process: subprocess.Popen
    started_at: float
    restarts: int = 0
    backoff: float = 0.0
    restart_at: float | None = None  # a restart scheduled (RESTARTED), not yet done
    exits: list[int] = field(default_factory=list)


def last_line(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = f.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


class Supervisor:
    """The children of one deployment process. Not thread-safe: one thread at a time starts, watches
    and stops (the forks themselves run on the spawning thread: see the module docstring). A context
    manager: leaving it stops every child that is left, in stop order."""

    def __init__(self, log: logging.Logger):
        self.log = log
        self.children: dict[str, Child] = {}
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="supervisor-spawn")

    def __enter__(self) -> "Supervisor":
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.stop()
        finally:
            self._spawner.shutdown()

    def start(self, spec: Spec) -> Child:
        """Starts `spec` (see the module docstring) and returns its child; does not wait."""
        if spec.before_start is not None:
            spec.before_start()
        command = spec.fresh_command() if spec.fresh_command is not None else spec.command
        spec.log.parent.mkdir(parents=True, exist_ok=True)
        # This checkout's modules first, whatever the environment's installation points at (a code
        # server imports the instance's storage class before it puts its working directory on the path).
        env = dict(spec.env or os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        with open(spec.log, "ab") as output:
            process = self._spawner.submit(
                subprocess.Popen, [*PDEATHSIG, *command], cwd=REPO_ROOT, env=env, stdout=output,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True).result()
        previous = self.children.get(spec.name)
        child = Child(spec, process, time.monotonic())
        if previous is not None:
            child.restarts, child.backoff, child.exits = previous.restarts, previous.backoff, previous.exits
        self.children[spec.name] = child
        return child

    def start_ready(self, spec: Spec) -> Child:
        self.start(spec)
        return self.wait_ready(spec.name)

    def wait_ready(self, name: str) -> Child:
        """Waits until the child serves (its spec's readiness); RunnerError if it exits first (but a
        `retry_until_ready` one, started again) or the time runs out."""
        child = self.children[name]
        spec = child.spec
        deadline = child.started_at + spec.ready_seconds
        while spec.ready is not None and not spec.ready.ready():
            if child.process.poll() is not None:
                if not (spec.retry_until_ready and time.monotonic() < deadline):
                    raise self._exited(child, "before it served")
                time.sleep(1.0)
                child = self.start(spec)
                continue
            if time.monotonic() > deadline:
                raise RunnerError(f"{spec.title} did not serve within {spec.ready_seconds:.0f} s "
                                  f"(last log line: {last_line(spec.log)!r}); see {spec.log}")
            time.sleep(0.1)
        return child

    def _exited(self, child: Child, when: str = "") -> RunnerError:
        spec = child.spec
        status = child.process.returncode
        return RunnerError(f"{spec.title} exited with status {status}{' ' + when if when else ''}; "
                           f"{spec.exit_hint}see {spec.log}")

    def watch(self) -> None:
        """One look at every child: a FATAL one that exited raises RunnerError (one line naming it and its
        log); a RESTARTED one is started again once its backoff is over (a warning says so)."""
        now = time.monotonic()
        for child in list(self.children.values()):
            spec = child.spec
            if child.restart_at is not None:
                if now >= child.restart_at:
                    self._restart(child, now)
                continue
            if child.process.poll() is None:
                continue
            if not spec.restart.restart:
                raise self._exited(child)
            child.exits.append(child.process.returncode)
            healthy = now - child.started_at >= spec.restart.healthy_seconds
            child.backoff = spec.restart.backoff_seconds if healthy or not child.backoff \
                else min(child.backoff * 2, spec.restart.max_backoff_seconds)
            child.restart_at = now + child.backoff
            self.log.warning("%s exited with status %s; restarting it in %.1f s (see %s)", spec.title,
                             child.process.returncode, child.restart_at - now, spec.log)

    def _restart(self, child: Child, now: float) -> None:
        """A RESTARTED child started again; if its start fails (its `before_start` could not reach what
        it needs), tried again after the next backoff."""
        child.restart_at = None
        child.restarts += 1
        try:
            self.start(child.spec)
        except Exception as error:  # noqa: BLE001 - the deployment goes on; the next attempt may succeed
            child.backoff = min(max(child.backoff, child.spec.restart.backoff_seconds) * 2,
                                child.spec.restart.max_backoff_seconds)
            child.restart_at = now + child.backoff
            self.log.warning("%s could not be started again (%s); trying in %.1f s", child.spec.title,
                             str(error).splitlines()[0] if str(error) else type(error).__name__, child.backoff)

    def pid(self, name: str) -> int | None:
        child = self.children.get(name)
        return None if child is None or child.process.poll() is not None else child.process.pid

    def stop(self, names: list[str] | None = None) -> None:
        """The children named (every one by default) stopped in stop order: SIGTERM to each one's
        process group, SIGKILL to what is left of it after its share of the time (stop_group)."""
        chosen = [c for name, c in self.children.items() if names is None or name in names]
        for child in sorted(chosen, key=lambda c: (c.spec.stop_rank, c.spec.name)):
            if child.process.poll() is None:
                self.log.info("stopping %s", child.spec.name)
            stop_group(child.process, child.spec.stop_seconds)
            del self.children[child.spec.name]
