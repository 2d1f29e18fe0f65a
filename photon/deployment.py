"""The files and locks a deployment keeps under its data directory, and its environment: what `photon
run`, `photon up` and `photon check` share before any component starts.

- `DIR/dagster/dagster.yaml` (DAGSTER_YAML): the instance both modes and `dagster dev` open;
- `DIR/state/locks/<dc>.lock` (`exclusive`): one `photon run` or `photon up` per datacenter, whose
  holder owns every unfinished run of it; `DIR/state/locks/up.lock` (`only_one_up`): one `photon up`
  per data directory, holding its pid;
- the environment every child and run reads (`prepare_environment`);
- the instance, its storages created under a lock (`headless_instance`), and the runs a dead
  deployment left (`fail_orphaned_runs`);
- these datacenters' leases in the registry, held while the deployment runs (`datacenter_leases`).
"""

import fcntl
import hashlib
import json
import logging
import os
import tempfile
from contextlib import ExitStack, contextmanager
from pathlib import Path

import dagster as dg

from photon.dagster_internals import instance_at
from photon.run_processes import kill_run_process
from photon_assets.work_unit import TAG_DC, UNFINISHED
from resources.id_registry import registry_resource_from_env
from resources.registry.work_claims import leases_held
from resources.settings import pipeline_settings
from resources.state.layout import DATA_DIR_ENV, DATACENTERS_ENV, DataLayout
from sensors.dispatcher import RUN_LOG_LEVEL_ENV

DAGSTER_YAML = """\
# Instance of this data directory, used by `dagster dev` / `dagster-daemon` (see README).
# `photon run` reads it too, but launches runs in its own process (see photon/runner.py).
# Dagster's SQLite storage, each database's SQLAlchemy engine kept for the process (photon/sqlite_storage.py).
storage:
  custom:
    module: photon.sqlite_storage
    class: KeptEngineSqliteStorage
    config:
      base_dir: {dagster_home}
run_monitoring:
  enabled: true
  poll_interval_seconds: 30
# Under `photon up`, each run is a fork of one warm process that imported Dagster, the code location and
# the Spark Connect client once (photon/run_server.py); without that server (`dagster dev`), Dagster's
# default way: a new process per run.
run_launcher:
  module: photon.run_server
  class: ForkServerRunLauncher
  config:
    socket_path: {run_server_socket}
run_coordinator:
  module: dagster._core.run_coordinator
  class: QueuedRunCoordinator
  config:
    # A queued run waits for the next dequeue: every second, not the default 5 s (a run's latency).
    dequeue_interval_seconds: 1
    # Two slots for the work units (a query run and a click run side by side) and one for the work
    # kept off the click path: by priority alone, work units under load took both slots and a check,
    # refresh or maintenance run waited until the queue held no work unit at all.
    max_concurrent_runs: 3
    tag_concurrency_limits:
      # Every work unit's run has this tag (its value the unit's id): two at a time, whatever the id.
      - key: photon/work_unit
        limit: 2
      # The embedded registry is a DuckDB file that one process at a time may hold.
      - key: photon/uses_registry
        value: "true"
        limit: 1
      # Work kept off the click path (aggregates refresh, table maintenance, table checks;
      # photon_assets/jobs.py) takes one slot at most: the third.
      - key: photon/off_click_path
        value: "true"
        limit: 1
# Each sensor the daemon ticks on a thread of its own: a click log dispatcher's tick may wait for its
# run in flight to finish (sensors/dispatcher.py: await_run_end) while the others tick. `photon run`
# ticks them itself, one after another, and its ticks never wait.
sensors:
  use_threads: true
  num_workers: 8
# Dagster's freshness daemon evaluates the assets' FreshnessPolicy (photon_assets/freshness.py) every 30 s
# (FRESHNESS_DAEMON_INTERVAL_SECONDS) and records each change of state; Dagster 1.13 enables it by default.
freshness:
  enabled: true
telemetry:
  enabled: false
# No community sign-up dialog over the UI of a deployment.
nux:
  enabled: false
"""

def instance_yaml(dagster_home: Path, run_server_socket: Path) -> str:
    """The data directory's dagster.yaml (DAGSTER_YAML)."""
    return DAGSTER_YAML.format(dagster_home=json.dumps(str(dagster_home)), run_server_socket=json.dumps(str(run_server_socket)))


# A Unix socket's path fits in sun_path's 108 bytes with its terminating NUL.
SOCKET_PATH_MAX_BYTES = 107


def run_server_socket(layout: DataLayout) -> Path:
    """Where `photon up`'s run server (photon/run_server.py) listens: under the data directory, or,
    for a data directory too deep for a socket's path (bind fails: "AF_UNIX path too long"), in a
    directory of this user's under the temporary directory, named by the data directory."""
    path = layout.root / "state" / "up" / "run_server.sock"
    if len(os.fsencode(path)) <= SOCKET_PATH_MAX_BYTES:
        return path
    named = hashlib.sha256(os.fsencode(layout.root.resolve())).hexdigest()[:20]
    return Path(tempfile.gettempdir()) / f"photon-{os.getuid()}" / f"run-server-{named}.sock"


class RunnerError(RuntimeError):
    """A condition that stops `photon run` with a one-line message."""


class Stopped(RunnerError):
    """`photon run` stopped by SIGINT or SIGTERM before it was idle: nothing verified, state kept."""


class DeploymentRunning(RunnerError):
    """A datacenter is `photon up`'s: its deployment owns the runs (and runs the checks itself)."""


def up_lock(layout: DataLayout) -> Path:
    """`photon up`'s lock: held while it runs, and holding its pid."""
    return layout.root / "state" / "locks" / "up.lock"


def running_up(layout: DataLayout) -> str | None:
    """The pid of the `photon up` running on this data directory, if one is."""
    try:
        with open(up_lock(layout)) as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return lock.read().strip() or "?"
    except FileNotFoundError:
        pass
    return None


@contextmanager
def exclusive(layout: DataLayout, datacenters: list[str]):
    """One `photon run` per datacenter of a data directory: it owns every unfinished run of its
    datacenters. Pipelines of other datacenters may run in other processes at the same time."""
    locks = layout.root / "state" / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with ExitStack() as held:
        for dc in sorted(datacenters):
            lock = held.enter_context(open(locks / f"{dc}.lock", "a"))
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                up = running_up(layout)
                if up is not None:
                    raise DeploymentRunning(f"photon up (pid {up}) is running datacenter {dc} of {layout.root}") from None
                raise RunnerError(f"another photon run is running datacenter {dc} of {layout.root}") from None
        yield


def prepare_environment(layout: DataLayout, datacenters: list[str], run_log_level: str) -> None:
    os.environ[DATA_DIR_ENV] = str(layout.root)
    os.environ[RUN_LOG_LEVEL_ENV] = run_log_level
    os.environ[DATACENTERS_ENV] = ",".join(datacenters)
    os.environ["DAGSTER_HOME"] = str(layout.dagster_home)
    layout.dagster_home.mkdir(parents=True, exist_ok=True)
    yaml = layout.dagster_home / "dagster.yaml"
    text = instance_yaml(layout.dagster_home, run_server_socket(layout))
    if not yaml.exists() or yaml.read_text() != text:
        # Renamed into place whole: another datacenter's `photon run` starting at the same moment
        # must never load a half-written file.
        partial = yaml.with_name(f".dagster.yaml.{os.getpid()}")
        partial.write_text(text)
        partial.replace(yaml)


def headless_instance(layout: DataLayout) -> dg.DagsterInstance:
    """The data directory's instance. Its SQLite storages are created (schema and migration stamp)
    under a lock: two datacenters' `photon run` starting at once on a new directory would both
    stamp the schema version, which Dagster then refuses to open."""
    with open(layout.dagster_home / ".storage.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        instance = instance_at(layout.dagster_home, in_process_runs=True)
        instance.get_runs_count()
        instance.all_instigator_state()
        instance.fetch_materializations(dg.AssetKey("joined_clicks"), limit=1)
    return instance


def fail_orphaned_runs(instance: dg.DagsterInstance, datacenters: list[str]) -> int:
    """Runs of these datacenters left unfinished by a `photon run` or `photon up` that died (we hold
    their locks): mark them failed, so that the dispatchers retry their work units. A daemon's run
    process outlives a `photon up` killed by SIGKILL; it is killed first, so it cannot write while its
    work unit is retried."""
    unfinished = instance.get_runs(dg.RunsFilter(statuses=[*UNFINISHED, dg.DagsterRunStatus.CANCELING]))
    orphans = [run for run in unfinished if run.tags.get(TAG_DC) in datacenters]
    for run in orphans:
        pid = kill_run_process(instance, run.run_id)
        reason = f"its process (pid {pid}) outlived the photon up that launched it; killed" if pid else \
            "the photon run or photon up process executing it died"
        instance.report_run_failed(run, reason)
    return len(orphans)


@contextmanager
def datacenter_leases(layout: DataLayout, datacenters: list[str], log: logging.Logger):
    """These datacenters' leases in the registry (resources/registry/ownership.py), held while the pipeline
    runs: once one lapses, the other datacenters take over its share of the click lines."""
    registry = registry_resource_from_env(str(layout.root), resolved=True).get()
    with leases_held(registry, datacenters, pipeline_settings().lease_seconds, log):
        yield


@contextmanager
def only_one_up(layout: DataLayout):
    lock_path = up_lock(layout)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            raise RunnerError(f"photon up is already running on {layout.root} (pid {lock.read().strip() or '?'})") from None
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        yield
