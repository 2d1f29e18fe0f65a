"""Every child process of a deployment, declared once: the table COMPONENTS (name, command, readiness,
restart policy, stop order), which photon/supervisor.py starts, watches and stops. docs/ARCHITECTURE.md
("The processes") shows the same table.

`photon run` starts the registry (unless PHOTON_REGISTRY_ADDRESS names one) and a query tailer per
datacenter; `photon up` all of them; `photon check` the registry alone. Stop order: lower first, so
nothing still running meets a component already stopped (the daemon first: no new runs; the registry
last: the runs and tailers call it).
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from photon.deployment import RunnerError, run_server_socket
from photon.supervisor import FATAL, RESTARTED, Readiness, Restart, Spec, Supervisor
from resources.event_store.progress import QueryTail
from resources.registry.api import ADDRESS_ENV
from resources.spark.connect_server import server_command, server_environment
from resources.state.layout import REPO_ROOT, DataLayout

BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Launch:
    """What one start of a component is given: the data directory, the environment its command runs
    in, and, where the table says so, the datacenter (or member) it is for and the port it serves on."""

    layout: DataLayout
    env: dict[str, str]
    of: str | None = None
    port: int | None = None
    options: dict = field(default_factory=dict)


# Readiness, polled by the supervisor until it says the component serves.
@dataclass(frozen=True)
class FileWritten:
    path: Path
    what: str = "its ready file"

    def ready(self) -> bool:
        return self.path.exists()


@dataclass(frozen=True)
class Listening:
    port: int
    host: str = "127.0.0.1"
    what: str = "its port"

    def ready(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                return True
        except OSError:
            return False


@dataclass(frozen=True)
class HttpOk:
    url: str
    what: str = "its URL"

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url, timeout=2):
                return True
        except OSError:
            return False


def registry_ready_file(layout: DataLayout) -> Path:
    return layout.root / "state" / "registry.address"


def up_log(name: str) -> Callable[[Launch], Path]:
    return lambda launch: launch.layout.root / "state" / "up" / f"{name}.log"


# Commands, one per component, from its Launch.
def registry_command(launch: Launch) -> list[str]:
    return [sys.executable, "-m", "photon.cli", "registry", "serve", "--data-dir", str(launch.layout.root),
            "--port", "0", "--ready-file", str(registry_ready_file(launch.layout))]


def tailer_command(launch: Launch) -> list[str]:
    return [sys.executable, "-m", "photon.cli", "event-store", "tail", "--data-dir", str(launch.layout.root),
            "--datacenter", str(launch.of), "--settings", launch.options["settings"]]


def spark_connect_command(launch: Launch) -> list[str]:
    return server_command(launch.port, master=launch.options["master"])


def run_server_command(launch: Launch) -> list[str]:
    return [sys.executable, "-m", "photon.run_server", str(run_server_socket(launch.layout))]


def code_server_command(launch: Launch) -> list[str]:
    return [str(BIN / "dagster"), "api", "grpc", "--host", "127.0.0.1", "--port", str(launch.port), "--module-name",
            "definitions", "--working-directory", str(REPO_ROOT), "--location-name", "photon"]


def webserver_command(launch: Launch) -> list[str]:
    return [str(BIN / "dagster-webserver"), "-w", str(launch.options["workspace"]), "-h", "127.0.0.1", "-p",
            str(launch.port)]


def daemon_command(launch: Launch) -> list[str]:
    return [str(BIN / "dagster-daemon"), "run", "-w", str(launch.options["workspace"])]


def etcd_command(launch: Launch) -> list[str]:
    """A member of the replicated registry's local etcd cluster (photon/registry_cluster.py). Raft's
    timing is raised from etcd's 100 ms heartbeat and 1 s election: on two cores beside Spark a member
    missed heartbeats and the cluster elected leaders (and held writes) for nothing."""
    o = launch.options
    client, peer = f"http://{o['host']}:{launch.port}", f"http://{o['host']}:{o['member']['peer_port']}"
    return ["etcd", "--name", o["member"]["name"], "--data-dir", str(o["dir"]), "--listen-client-urls", client,
            "--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", o["peers"], "--initial-cluster-state", o["state"], "--initial-cluster-token",
            o["token"], "--heartbeat-interval", "250", "--election-timeout", "2500", "--logger", "zap",
            "--log-level", "warn"]


def replica_command(launch: Launch) -> list[str]:
    o = launch.options
    return [sys.executable, "-m", "photon.cli", "registry", "serve", "--data-dir", str(launch.layout.root),
            "--replica", o["name"], "--etcd", o["endpoints"], "--host", o["host"], "--port", str(launch.port),
            "--ready-file", str(o["dir"] / "ready")]


@dataclass(frozen=True)
class Component:
    """A row of the table: how a component is started, known ready, restarted and stopped."""

    name: str
    command: Callable[[Launch], list[str]]
    ready: Callable[[Launch], Readiness] | None
    restart: Restart
    stop_rank: int
    stop_seconds: float
    log: Callable[[Launch], Path]
    ready_seconds: float = 60.0
    title: str | None = None  # how lines name it (default: its name)

    def spec(self, launch: Launch, **overrides) -> Spec:
        name = f"{self.name}-{launch.of}" if launch.of else self.name
        return Spec(name=name, title=(self.title or self.name).format(of=launch.of), command=self.command(launch),
                    log=self.log(launch), restart=self.restart, stop_rank=self.stop_rank,
                    stop_seconds=self.stop_seconds, ready=self.ready(launch) if self.ready else None,
                    ready_seconds=self.ready_seconds, env=launch.env, **overrides)


COMPONENTS = {c.name: c for c in (
    # name, command, readiness, restart policy, stop order (lower first) and its seconds to SIGKILL, log
    Component("dagster-daemon", daemon_command, None, FATAL, 0, 5.0, up_log("dagster-daemon")),
    Component("run-server", run_server_command, lambda l: FileWritten(run_server_socket(l.layout), "its socket"),
              FATAL, 1, 2.0, up_log("run-server")),
    Component("dagster-webserver", webserver_command, lambda l: HttpOk(f"http://127.0.0.1:{l.port}/server_info"),
              FATAL, 2, 2.0, up_log("dagster-webserver"), ready_seconds=180.0),
    # It binds its port only once the code location is loaded: the daemon and the webserver find it loaded.
    Component("code-server", code_server_command, lambda l: Listening(l.port), FATAL, 3, 2.0, up_log("code-server"),
              ready_seconds=180.0),
    Component("spark-connect", spark_connect_command, lambda l: Listening(l.port), FATAL, 4, 2.0,
              up_log("spark-connect"), ready_seconds=120.0),
    # Resumes where the registry says it read to (photon/query_tail.py): restarted, not fatal.
    Component("query-tailer", tailer_command, None, RESTARTED, 5, 10.0,
              lambda l: l.layout.root / "state" / f"query_tail_{l.of}.log", title="the query tailer of {of}"),
    # The registry of one machine: nothing else holds its ids, so its exit stops the deployment.
    Component("registry", registry_command, lambda l: FileWritten(registry_ready_file(l.layout)), FATAL, 6, 30.0,
              lambda l: l.layout.root / "state" / "registry.log", title="the local registry service"),
    # The replicated registry (photon/registry_cluster.py): any one replica or member may die, the others
    # go on; restarted, it catches up (a replica copies a live one's state if the log moved past it).
    Component("registry-replica", replica_command, lambda l: FileWritten(l.options["dir"] / "ready"), RESTARTED, 6,
              10.0, lambda l: l.layout.root / "state" / f"registry-replica-{l.of}.log", ready_seconds=300.0,
              title="registry replica {of}"),
    Component("etcd", etcd_command, lambda l: Listening(l.port), RESTARTED, 7, 5.0,
              lambda l: l.layout.root / "state" / f"etcd-{l.of}.log", title="etcd member {of}"),
)}


def registry_lock(layout: DataLayout) -> Path:
    return layout.root / "state" / "locks" / "registry.lock"


@contextmanager
def local_registry(supervisor: Supervisor, layout: DataLayout) -> Iterator[None]:
    """Uses the registry service at PHOTON_REGISTRY_ADDRESS, or starts one on the data directory's
    registry files for as long as this deployment (the README's commands work with nothing else
    running); sets PHOTON_REGISTRY_ADDRESS to it meanwhile, for the runs, the tailers and the summary.
    The supervisor stops it last, after what calls it."""
    if os.environ.get(ADDRESS_ENV):
        yield
        return
    ready = registry_ready_file(layout)
    ready.parent.mkdir(parents=True, exist_ok=True)
    lock_path = registry_lock(layout)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as owner:
        try:
            fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunnerError(
                f"the registry of {layout.root} is served by another photon run; to run datacenters in "
                "separate processes, start `photon registry serve` once and set " + ADDRESS_ENV + " for each"
            ) from None
        component = COMPONENTS["registry"]
        # A server of a deployment that just died may still hold the files: started again until ready.
        spec = component.spec(Launch(layout, dict(os.environ)), retry_until_ready=True,
                              exit_hint="state is kept, run again to continue; ",
                              before_start=lambda: ready.unlink(missing_ok=True))
        supervisor.start_ready(spec)
        supervisor.log.info("local registry service at %s", ready.read_text().strip())
        os.environ[ADDRESS_ENV] = ready.read_text().strip()
        try:
            yield
        finally:
            del os.environ[ADDRESS_ENV]


# How long the start waits for each query tailer's first mirror (query_tailers).
TAILER_FIRST_MIRROR_SECONDS = 15.0


@contextmanager
def query_tailers(supervisor: Supervisor, layout: DataLayout, datacenters: list[str],
                  settings_json: str) -> Iterator[list[str]]:
    """A query tailer per datacenter (photon/query_tail.py), stopped at the end; yields their names
    once each has written its first mirror, or TAILER_FIRST_MIRROR_SECONDS have passed. The
    dispatchers' first ticks then see it feeding: the query dispatcher would otherwise cut a durable-
    tier unit at once, beside the first click run in a cold JVM (sensors/dispatcher.py: click_path_cold).
    The tailer is not a component anything waits on to be correct: a late one is only a slower start."""
    names, started = [], time.time()
    for dc in datacenters:
        spec = COMPONENTS["query-tailer"].spec(Launch(layout, dict(os.environ), of=dc, options={"settings": settings_json}))
        supervisor.start(spec)
        names.append(spec.name)
    deadline = time.monotonic() + TAILER_FIRST_MIRROR_SECONDS
    while (time.monotonic() < deadline
           and any(QueryTail.load(layout.query_tail_file(dc)).updated_at < started for dc in datacenters)):
        time.sleep(0.1)
    try:
        yield names
    finally:
        supervisor.stop(names)


def start_component(supervisor: Supervisor, name: str, launch: Launch) -> Spec:
    """A component of the table started (not waited for); its spec."""
    spec = COMPONENTS[name].spec(launch)
    supervisor.start(spec)
    return spec


def spark_connect_launch(layout: DataLayout, port: int, master: str) -> Launch:
    return Launch(layout, server_environment(), port=port, options={"master": master})
