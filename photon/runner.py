"""`photon run --until-idle`: the sensor-driven pipeline, headless, through Dagster's own machinery.

This process plays the Dagster daemon's sensor role: it calls the daemon's sensor iteration
(photon/dagster_internals.py, where every Dagster internal lives) against the data directory's instance,
so ticks, cursors, run keys and tick resumption behave exactly as under `dagster-daemon`. Runs are
launched with Dagster's synchronous in-process run launcher, so every run of this process shares
one Spark session (a JVM start costs ~8 s on 2 cores) and the embedded registry's DuckDB file.

The instance on disk (`<data-dir>/dagster`) is the one `dagster dev` opens: runs, ticks, asset
materializations and check results of headless runs all show in the UI.
"""

import ctypes
import fcntl
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from contextlib import ExitStack, contextmanager
from pathlib import Path

import dagster as dg

from photon.check_outcomes import CheckOutcome, outcomes
from photon.dagster_internals import (
    in_process_workspace,
    instance_at,
    remote_sensors,
    runs_on_several_threads,
    sensor_pass,
)
from photon.query_tail import TailSettings
from photon.run_processes import kill_run_process
from photon.summary import summarize
from photon.tailers import QueryTailers
from photon_assets.jobs import VERIFY_JOB
from resources.id_registry import ADDRESS_ENV, registry_resource_from_env
from resources.registry.work_claims import leases_held
from resources.runtime.priority import lower_this_thread
from resources.runtime.repeating import repeated
from resources.settings import pipeline_settings
from resources.spark.session import spark_session
from resources.state.layout import DATA_DIR_ENV, DATACENTERS_ENV, REPO_ROOT, TABLES, DataLayout
from resources.state.work_unit_log import WorkUnitLog, new_ranges
from sensors.dispatcher import RUN_LOG_LEVEL_ENV, pending_retry
from sensors.freshness import FRESHNESS_SENSOR
from sensors.upkeep import AGGREGATES_SENSOR, CHECKS_SENSOR, MAINTENANCE_SENSOR
from photon_assets.work_unit import (
    PENDING_RETRY,
    TAG_DC,
    UNFINISHED,
    has_run,
    work_units_awaiting_retry,
    work_units_failed_for_good,
    work_units_in_flight,
)
from spark_ops.tables import table_committed, tables_locked

# Sensor passes in a row that launch nothing before the pipeline counts as idle: one, as every sensor of
# the main loop's pass ticks in every pass (photon/dagster_internals.py: sensor_pass) in PASS_ORDER; the
# query dispatchers' work counts until it is cut and run (dispatchers_waiting).
IDLE_PASSES = 1
PASS_INTERVAL_SECONDS = 1.05  # passes start at least this far apart; sensors due every second tick in each

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
      # photon_assets/jobs.py) and the freshness check's runs take one slot at most: the third.
      - key: photon/off_click_path
        value: "true"
        limit: 1
      - key: dagster/sensor_name
        value: joined_clicks_freshness_sensor
        limit: 1
# Each sensor the daemon ticks on a thread of its own: a click log dispatcher's tick may wait for its
# run in flight to finish (sensors/dispatcher.py: await_run_end) while the others tick. `photon run`
# ticks them itself, one after another, and its ticks never wait.
sensors:
  use_threads: true
  num_workers: 8
telemetry:
  enabled: false
# No community sign-up dialog over the UI of a deployment.
nux:
  enabled: false
"""

def instance_yaml(dagster_home: Path, run_server_socket: Path) -> str:
    """The data directory's dagster.yaml (DAGSTER_YAML)."""
    return DAGSTER_YAML.format(dagster_home=json.dumps(str(dagster_home)), run_server_socket=json.dumps(str(run_server_socket)))


def run_server_socket(layout: DataLayout) -> Path:
    """Where `photon up`'s run server (photon/run_server.py) listens."""
    return layout.root / "state" / "up" / "run_server.sock"


class RunnerError(RuntimeError):
    """A condition that stops `photon run` with a one-line message."""


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


def workspace(instance: dg.DagsterInstance):
    return in_process_workspace(instance, "definitions", REPO_ROOT, "photon")


def loaded_sensors(context) -> list:
    """The dispatchers of the code location, not the freshness sensor (sensors/freshness.py) nor the table
    checks' (photon run verifies once its drain is idle)."""
    sensors, errors = remote_sensors(context)
    if errors:
        raise RunnerError(f"definitions failed to load: {errors[0]}")
    return [sensor for sensor in sensors if sensor.name not in (FRESHNESS_SENSOR, CHECKS_SENSOR)]


REGISTRY_START_SECONDS = 60.0


def last_line(path: str) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
        lines = f.read().decode("utf-8", "replace").strip().splitlines()
    return lines[-1][:300] if lines else ""


def die_with_parent() -> None:
    """In a child process (registry, `photon up`'s components): SIGTERM when its parent dies, even by
    SIGKILL (Linux prctl)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def stop_if_exited(name: str, process: subprocess.Popen, log: Path, hint: str = "") -> None:
    """A child this process depends on and nothing restarts (the local registry service, `photon
    up`'s components) stops it once it exited: RunnerError naming it, its exit status and its log."""
    if process.poll() is not None:
        raise RunnerError(f"{name} exited with status {process.returncode}; {hint}see {log}")


def registry_log(layout: DataLayout) -> Path:
    return layout.root / "state" / "registry.log"


@contextmanager
def registry_service(layout: DataLayout, log: logging.Logger):
    """Uses the registry service at PHOTON_REGISTRY_ADDRESS, or starts a local one on the data
    directory's registry files for the duration of this `photon run` (or `photon check`, or
    `photon up`) (the README's commands keep working with nothing else running). Yields the local
    service's process (None for a service at PHOTON_REGISTRY_ADDRESS), for its owner to watch."""
    if os.environ.get(ADDRESS_ENV):
        yield None
        return
    ready = layout.root / "state" / "registry.address"
    ready.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + REGISTRY_START_SECONDS
    with open(layout.root / "state" / "locks" / "registry.lock", "a") as owner, \
            open(registry_log(layout), "ab") as output:
        try:
            fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunnerError(
                f"the registry of {layout.root} is served by another photon run; to run datacenters in "
                "separate processes, start `photon registry serve` once and set " + ADDRESS_ENV + " for each"
            ) from None
        while True:
            ready.unlink(missing_ok=True)
            server = subprocess.Popen(
                [sys.executable, "-m", "photon.cli", "registry", "serve", "--data-dir", str(layout.root),
                 "--port", "0", "--ready-file", str(ready)],
                # A session of its own: a signal to the caller's process group (a terminal's Ctrl-C,
                # systemd's stop) reaches the caller alone, which stops the service last, after the
                # runs that use it; it dies with the caller all the same (die_with_parent).
                stdout=output, stderr=output, cwd=REPO_ROOT, preexec_fn=die_with_parent, start_new_session=True,
            )
            while not ready.exists() and server.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            if ready.exists():
                break
            exited = server.poll()
            server.kill()
            server.wait()
            # A server of a `photon run` that just died may still be closing the registry files.
            if time.monotonic() >= deadline:
                state = "still starting" if exited is None else f"exit status {exited}"
                raise RunnerError(
                    f"the local registry service did not start in {REGISTRY_START_SECONDS:.0f} s ({state}; "
                    f"last log line: {last_line(output.name)!r}); see {output.name}"
                )
            time.sleep(1.0)
        address = ready.read_text().strip()
        log.info("local registry service at %s", address)
        # Runs and the summary pick the service up from here (resources/id_registry.py).
        os.environ[ADDRESS_ENV] = address
        try:
            yield server
        finally:
            del os.environ[ADDRESS_ENV]
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def start_spark_session(log: logging.Logger) -> None:
    """Starts the process's Spark session (~5 s of JVM start on 2 cores) while Dagster's workspace
    loads; the first run's session request waits for it (resources/spark/session.py:
    one session per process). A failure here is the first run's to report, as that run's error."""
    try:
        spark_session()
    except Exception as error:  # the run that needs the session reports it again, as its error
        log.debug("early Spark session start failed: %s", error)


@contextmanager
def query_tailers(layout: DataLayout, datacenters: list[str], log: logging.Logger):
    """The datacenters' query tailers (photon/tailers.py), for as long as the registry service."""
    tailers = QueryTailers(layout, datacenters, log, TailSettings.of(pipeline_settings()).to_json()).start()
    try:
        yield tailers
    finally:
        tailers.stop()


@contextmanager
def datacenter_leases(layout: DataLayout, datacenters: list[str], log: logging.Logger):
    """These datacenters' leases in the registry (resources/registry/ownership.py), held while the pipeline
    runs: once one lapses, the other datacenters take over its share of the click lines."""
    registry = registry_resource_from_env(str(layout.root), resolved=True).get()
    with leases_held(registry, datacenters, pipeline_settings().lease_seconds, log):
        yield


MAX_RECOVERY_ROUNDS = 2  # recovery, then pipeline and verification again; more would repeat itself


def run_until_idle(
    layout: DataLayout, datacenters: list[str], log: logging.Logger, timeout_seconds: float, run_log_level: str = "WARNING",
    min_seconds: float = 0.0,
) -> dict:
    """Ticks every dispatcher until a pass launches nothing and no failed work unit waits for a
    retry, and at least `min_seconds` have passed (logs still being written: the pipeline keeps
    tailing them meanwhile); then verifies the output. When verification fails, the
    recovery job runs and the pipeline goes on (the re-injected clicks are pending clicks), up to
    MAX_RECOVERY_ROUNDS times. Returns the summary."""
    started = time.monotonic()
    prepare_environment(layout, datacenters, run_log_level)
    with exclusive(layout, datacenters), registry_service(layout, log) as registry, \
            datacenter_leases(layout, datacenters, log), query_tailers(layout, datacenters, log) as tailers:
        # Only after the registry child is forked: its `preexec_fn` is not safe while another thread
        # runs (subprocess's documentation), and this one forks the JVM.
        threading.Thread(target=start_spark_session, args=(log,), name="spark-session-start", daemon=True).start()
        instance = headless_instance(layout)
        orphans = fail_orphaned_runs(instance, datacenters)
        if orphans:
            log.warning("marked %d run(s) of a dead process as failed; their work units will be retried", orphans)
        # Hand-off files of this datacenter's runs that died with their process (none is alive: we
        # hold its lock). Work unit ids start with their datacenter.
        for dc in datacenters:
            for leftover in layout.staging.glob(f"{dc}.*"):
                shutil.rmtree(leftover, ignore_errors=True)
        first_run = own_runs(instance, datacenters)
        recoveries = []
        if storage_lost(layout):
            log.warning("data files of output tables are missing (storage loss): running recovery first")
            recoveries.append(recover(instance, log))
        with workspace(instance) as context:
            sensors = loaded_sensors(context)
            for sensor in sensors:
                start_sensor(instance, sensor)
            try:
                while True:
                    drain(Drain(instance, context, sensors, layout, datacenters, log, started, timeout_seconds,
                                first_run, registry, min_seconds, tailers))
                    checks = verify(instance, layout)
                    verification = {check.name: check.passed for check in checks}
                    if all(verification.values()) or len(recoveries) >= MAX_RECOVERY_ROUNDS:
                        break
                    failed = sorted(name for name, passed in verification.items() if not passed)
                    log.warning("verification failed (%s): running the recovery job", ", ".join(failed))
                    recoveries.append(recover(instance, log))
                    if not recovery_did_work(recoveries[-1]):
                        break
            finally:
                for sensor in sensors:
                    instance.stop_sensor(sensor.get_remote_origin_id(), sensor.selector_id, sensor)
        runs = own_runs(instance, datacenters) - first_run
        summary = summarize(layout, datacenters, instance, pending_clicks(checks))
    summary.update(runs=runs, verification=verification, recoveries=recoveries,
                   wall_seconds=round(time.monotonic() - started, 2))
    return summary


def start_sensor(instance: dg.DagsterInstance, sensor) -> None:
    """Marks a sensor running. Sensors of no datacenter (the aggregates refresh, table maintenance)
    are shared: another datacenter's `photon run` starting on the same instance at the same moment
    may store the sensor's state between Dagster's check for it and its insert, which then raises;
    starting it again finds that state and updates it."""
    try:
        instance.start_sensor(sensor)
    except dg.DagsterInvariantViolationError:
        instance.start_sensor(sensor)


def own_runs(instance: dg.DagsterInstance, datacenters: list[str]) -> int:
    """Runs of these datacenters' work units (other datacenters' pipelines share the instance)."""
    return sum(instance.get_runs_count(dg.RunsFilter(tags={TAG_DC: dc})) for dc in datacenters)


# Within a pass: query work first, then click work, then pending-click retries, then the work kept
# off the click path (sensors/upkeep.py). `photon run` ticks the query dispatchers and that work on a
# thread of their own (off_click_passes), the click and pending-click dispatchers on the main loop.
PASS_ORDER = ("query_log_dispatcher_", "click_log_dispatcher_", "pending_click_dispatcher_", AGGREGATES_SENSOR,
              MAINTENANCE_SENSOR)


def pass_order(sensors: list) -> list:
    """The order of a pass's sensors: PASS_ORDER, where the daemon shuffles them (for fairness between
    code locations; `photon run` has one)."""
    return sorted(sensors, key=lambda s: (next((i for i, p in enumerate(PASS_ORDER) if s.name.startswith(p)), 99), s.name))


def off_the_click_path(sensor) -> bool:
    """The query dispatchers (the durable tier, now that the query tailers feed the memory tier), the
    aggregates refresher and table maintenance: they tick on a thread of their own (off_click_passes)."""
    return sensor.name.startswith((PASS_ORDER[0], AGGREGATES_SENSOR, MAINTENANCE_SENSOR))


def click_pass_order(sensors: list) -> list:
    """The main loop's pass: the click and pending-click dispatchers."""
    return [s for s in pass_order(sensors) if not off_the_click_path(s)]


def off_click_pass_order(sensors: list) -> list:
    return [s for s in pass_order(sensors) if off_the_click_path(s)]


@contextmanager
def off_click_passes(context, log: logging.Logger):
    """The sensors off the click path ticked on a thread of their own, their runs executed on it beside
    the main loop's click runs, on the same Spark session: the query tailers feed the memory tier, so
    no click run waits for a query run, an aggregates refresh or a table maintenance run. The thread
    runs at a lower CPU priority than the click runs (resources/runtime/priority.py)."""
    runs_on_several_threads()

    def one_pass() -> None:
        lower_this_thread()  # the pass's thread, from its first pass on
        try:
            sensor_pass(context, log, off_click_pass_order, PASS_INTERVAL_SECONDS)
        except Exception:  # a tick's own errors are recorded as failed ticks; this is anything else
            log.exception("a pass of the sensors off the click path failed; the next one goes on")

    with repeated(one_pass, PASS_INTERVAL_SECONDS, "off-click-path"):
        yield


@dataclass
class Drain:
    """What `photon run`'s passes go by until idle: the instance and workspace with the sensors, these
    datacenters, when it started and may go on until, the runs there were before it, this process's
    own registry service (None: a service at PHOTON_REGISTRY_ADDRESS, which its operator restarts)
    and query tailers."""

    instance: dg.DagsterInstance
    context: object
    sensors: list
    layout: DataLayout
    datacenters: list[str]
    log: logging.Logger
    started: float
    timeout_seconds: float
    first_run: int
    registry: subprocess.Popen | None
    min_seconds: float = 0.0
    tailers: QueryTailers | None = None

    def runs(self) -> int:
        return own_runs(self.instance, self.datacenters)


def drain(d: Drain) -> None:
    """Sensor passes until IDLE_PASSES in a row launch nothing and nothing of these datacenters
    waits, and min_seconds have passed since the start. Stops when this process's own registry
    service exited: nothing would restart it, and every run would fail until the timeout."""
    with off_click_passes(d.context, d.log.getChild("sensors")):
        _drain(d)


def _drain(d: Drain) -> None:
    idle = 0
    while idle < IDLE_PASSES or time.monotonic() - d.started < d.min_seconds:
        if time.monotonic() - d.started > d.timeout_seconds:
            raise RunnerError(f"not idle after {d.timeout_seconds:.0f} s; state is kept, run again to continue")
        if d.registry is not None:
            stop_if_exited("the local registry service", d.registry, registry_log(d.layout),
                           "state is kept, run again to continue; ")
        if d.tailers is not None:
            d.tailers.watch()
        pass_started = time.monotonic()
        before = d.runs()
        sensor_pass(d.context, d.log.getChild("sensors"), click_pass_order, PASS_INTERVAL_SECONDS)
        launched = d.runs() - before
        retrying = [u for u in work_units_awaiting_retry(d.instance) if u.split(".")[0] in d.datacenters]
        waiting = retrying or dispatchers_waiting(d.instance, d.sensors, d.layout, d.datacenters)
        idle = idle + 1 if launched == 0 and not waiting else 0
        if launched:
            d.log.info("pass launched %d run(s); %d run(s) so far", launched, d.runs() - d.first_run)
        time.sleep(max(0.0, PASS_INTERVAL_SECONDS - (time.monotonic() - pass_started)))


def storage_lost(layout: DataLayout) -> bool:
    """Whether a table recovery can repair references data files that are gone."""
    from photon_assets.recovery import REPAIRABLE_TABLES
    from spark_ops.verification import missing_data_files

    paths = [layout.table(name) for name in REPAIRABLE_TABLES if table_committed(layout.table(name))]
    return any(missing_data_files(path) for path in paths)


def recover(instance: dg.DagsterInstance, log: logging.Logger) -> dict:
    """Runs the recovery job as a recorded run of the instance; returns what it did."""
    from photon_assets.recovery import RECOVER_JOB

    result = execute_job(instance, RECOVER_JOB)
    if not result.success:
        raise RunnerError(f"the recovery job failed (run {result.run_id}); see its logs in the Dagster UI")
    outcome = result.output_for_node("recover_clicks")
    log.info("recovery: %s", outcome)
    return outcome


def recovery_did_work(outcome: dict) -> bool:
    return bool(outcome["reinjected"] or outcome["token_ids_cleared"] or any(outcome["missing_files"].values()))


def dispatchers_waiting(instance: dg.DagsterInstance, sensors: list, layout: DataLayout, datacenters: list[str]) -> list[str]:
    """Work the sensors will launch without any new input: click work held back by pacing or left to
    another live datacenter (until it finishes it or its lease lapses: the pipelines of all
    datacenters are idle together), and pending clicks joinable with the data present once their
    retry backoff is over."""
    settings = pipeline_settings()
    waiting = []
    for sensor in sensors:
        state = instance.get_instigator_state(sensor.get_remote_origin_id(), sensor.selector_id)
        cursor = state.instigator_data.cursor if state and state.instigator_data else None
        state = json.loads(cursor) if cursor else {}
        if state.get("held"):
            waiting.append(f"{sensor.name}: pacing")
        if state.get("deferred"):
            waiting.append(f"{sensor.name}: query lines wait for the durable tier's cadence")
        if state.get("waiting"):
            waiting.append(f"{sensor.name}: another datacenter's share")
    # The query dispatchers tick on their own thread (off_click_passes): their work counts until it is cut and run.
    running = [u for u in work_units_in_flight(instance) if u.split(".")[0] in datacenters]
    if running:
        waiting.append(f"runs in flight: {', '.join(sorted(running))}")
    for dc in datacenters:
        log = WorkUnitLog.load(layout.work_unit_log(dc, "query"))
        if new_ranges(layout.stream_dir(dc, "query"), log.next_offsets()):
            waiting.append(f"{dc}: query lines not cut yet")
        # Between the query dispatcher's tick, which records the unit it cut, and the creation of the
        # run it requested, the unit is neither uncut nor in flight; pending clicks that wait for its
        # queries do not count as waiting while no query tailer's mirror is fresh (a tailer still
        # starting): a drain that ended there left them pending (a CI failure of
        # tests/e2e/test_photon_run.py, under load).
        last = next((unit for unit in reversed(log.units) if unit.dispatched), None)
        if last is not None and not has_run(instance, last.id):
            waiting.append(f"{dc}: query work unit {last.id} cut, its run not created yet")
    given_up = work_units_failed_for_good(instance)
    for dc in datacenters:
        if any(unit.startswith(f"{dc}.{PENDING_RETRY}.") for unit in given_up):
            continue  # reported in the summary; retrying more pending clicks would fail the same way
        decision = pending_retry(layout, dc, settings)
        if decision.ready or decision.wait_until is not None:
            waiting.append(f"{dc}: {decision.reason}")
    return waiting


@functools.cache
def code_location() -> dg.Definitions:
    """The code location whose jobs this process executes, built once, on first use: it reads the
    data directory from the environment."""
    from photon.code_location import definitions_from_env

    return definitions_from_env()


def execute_job(instance: dg.DagsterInstance, job_name: str, tags: dict | None = None,
                asset_check_selection: set[dg.AssetCheckKey] | None = None):
    """Runs a job of the code location in this process, as a recorded run of the instance; with
    `asset_check_selection`, only those checks of it (a subset run: no asset is materialized)."""
    job = code_location().resolve_job_def(job_name)
    if asset_check_selection is not None:
        job = job.get_subset(asset_check_selection=asset_check_selection)
    return job.execute_in_process(
        run_config={"loggers": {"console": {"config": {"log_level": os.environ[RUN_LOG_LEVEL_ENV]}}}},
        instance=instance,
        raise_on_error=False,
        tags=tags,
    )


def run_verify_job(instance: dg.DagsterInstance, layout: DataLayout, checks_only: bool = False,
                   tags: dict | None = None):
    """Runs the `verify` job (the aggregate refreshed from the change feed, then every asset check,
    whose aggregates check compares it with a full aggregation; with `checks_only`,
    the checks alone, reading the tables as they are) as a recorded run of the instance, with every
    table locked: a pipeline of another datacenter in another process waits at its next commit, so
    that the checks see one consistent state. Returns the ExecuteInProcessResult."""
    from photon_assets.checks import ALL_CHECKS

    selection = {check.check_key for check in ALL_CHECKS} if checks_only else None
    with tables_locked([layout.table(name) for name in TABLES]):
        return execute_job(instance, VERIFY_JOB, tags=tags or {"photon/kind": "verify"},
                           asset_check_selection=selection)


def pending_clicks(checks: list[CheckOutcome]) -> int | None:
    """The pending clicks clicks_accounted_for counted (photon_assets/checks.py, the one home of which
    clicks are pending); None if that check raised."""
    from photon_assets.checks import clicks_accounted_for

    name = clicks_accounted_for.check_key.name
    return next(check.metadata.get("pending") for check in checks if check.name == name)


def verify(instance: dg.DagsterInstance, layout: DataLayout) -> list[CheckOutcome]:
    """The `verify` job's outcome per check (see run_verify_job)."""
    return outcomes(run_verify_job(instance, layout))
