"""`photon run --until-idle`: the sensor-driven pipeline, headless, through Dagster's own machinery.

This process plays the Dagster daemon's sensor role: it calls the daemon's sensor iteration
(photon/dagster_internals.py, where every Dagster internal lives) against the data directory's instance,
so ticks, cursors, run keys and tick resumption behave exactly as under `dagster-daemon`. Runs are
launched with Dagster's synchronous in-process run launcher, so every run of this process shares
one Spark session (a JVM start costs ~8 s on 2 cores) and the registry client.

Its children (the local registry service, the query tailers) are photon/components.py's, started and
watched by photon/supervisor.py; its files and locks are photon/deployment.py's; verification and
recovery at the end are photon/verify.py's.

The instance on disk (`<data-dir>/dagster`) is the one `dagster dev` opens: runs, ticks, asset
materializations and check results of headless runs all show in the UI.
"""

import json
import logging
import shutil
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import dagster as dg

from photon.components import query_tailers
from photon.dagster_internals import in_process_workspace, remote_sensors, runs_on_several_threads, sensor_pass
from photon.deployment import (RunnerError, Stopped, datacenter_leases, exclusive, fail_orphaned_runs,
                               headless_instance, prepare_environment)
from photon.progress_line import Progress, progress_for, shown
from photon.query_tail import TailSettings
from photon.registry_cluster import registry_for
from photon.summary import summarize
from photon.supervisor import Supervisor
from photon.verify import MAX_RECOVERY_ROUNDS, pending_clicks, recover, recovery_did_work, storage_lost, verify
from photon_assets.work_unit import (
    PENDING_RETRY,
    TAG_DC,
    has_run,
    work_units_awaiting_retry,
    work_units_failed_for_good,
    work_units_in_flight,
)
from resources.runtime.priority import lower_this_thread
from resources.runtime.repeating import repeated
from resources.runtime.stop_signal import run_stoppable
from resources.settings import pipeline_settings
from resources.spark.session import spark_session
from resources.state.layout import REPO_ROOT, DataLayout
from resources.state.work_unit_log import WorkUnitLog, new_ranges
from sensors.alerts import ALERTS_SENSOR
from sensors.dispatcher import pending_retry
from sensors.upkeep import AGGREGATES_SENSOR, CHECKS_SENSOR, MAINTENANCE_SENSOR

# Sensor passes in a row that launch nothing before the pipeline counts as idle: one, as every sensor of
# the main loop's pass ticks in every pass (photon/dagster_internals.py: sensor_pass) in PASS_ORDER; the
# query dispatchers' work counts until it is cut and run (dispatchers_waiting).
IDLE_PASSES = 1
PASS_INTERVAL_SECONDS = 1.05  # passes start at least this far apart; sensors due every second tick in each


def workspace(instance: dg.DagsterInstance):
    return in_process_workspace(instance, "definitions", REPO_ROOT, "photon")


def loaded_sensors(context) -> list:
    """The dispatchers of the code location, not the table checks' sensor (photon run verifies once its
    drain is idle) nor the alerts' (its summary and exit status say what they would: sensors/alerts.py)."""
    sensors, errors = remote_sensors(context)
    if errors:
        raise RunnerError(f"definitions failed to load: {errors[0]}")
    return [sensor for sensor in sensors if sensor.name not in (CHECKS_SENSOR, ALERTS_SENSOR)]


def start_spark_session(log: logging.Logger) -> None:
    """Starts the process's Spark session (~5 s of JVM start on 2 cores) while Dagster's workspace
    loads; the first run's session request waits for it (resources/spark/session.py:
    one session per process). A failure here is the first run's to report, as that run's error."""
    try:
        spark_session()
    except Exception as error:  # the run that needs the session reports it again, as its error
        log.debug("early Spark session start failed: %s", error)


@dataclass(frozen=True)
class RunOptions:
    """How `photon run` goes (its command line): how long at most and at least, how much the runs log,
    the replicated registry's size (None: the data directory's, else one machine's), and whether a
    progress line is drawn on a terminal (photon/progress_line.py)."""

    timeout_seconds: float = 3600.0
    run_log_level: str = "WARNING"
    min_seconds: float = 0.0
    registry_replicas: int | None = None
    progress: bool = False


def run_until_idle(layout: DataLayout, datacenters: list[str], log: logging.Logger, options: RunOptions) -> dict:
    """Ticks every dispatcher until a pass launches nothing and no failed work unit waits for a
    retry, and at least `min_seconds` have passed (logs still being written: the pipeline keeps
    tailing them meanwhile); then verifies the output. When verification fails, the
    recovery job runs and the pipeline goes on (the re-injected clicks are pending clicks), up to
    MAX_RECOVERY_ROUNDS times. Returns the summary."""
    started = time.monotonic()
    prepare_environment(layout, datacenters, options.run_log_level)
    tailing = TailSettings.of(pipeline_settings()).to_json()
    with exclusive(layout, datacenters), Supervisor(log) as supervisor:
        # Spark's JVM starts first: it takes longest, and needs nothing of the rest.
        threading.Thread(target=start_spark_session, args=(log,), name="spark-session-start", daemon=True).start()
        with registry_for(supervisor, layout, options.registry_replicas), datacenter_leases(layout, datacenters, log), \
                query_tailers(supervisor, layout, datacenters, tailing):
            instance = headless_instance(layout)
            first_run, recoveries = opened(instance, layout, datacenters, log)
            with workspace(instance) as context:
                sensors = loaded_sensors(context)
                for sensor in sensors:
                    start_sensor(instance, sensor)
                drained = Drain(instance, context, sensors, layout, datacenters, log, started, options.timeout_seconds,
                                first_run, supervisor, options.min_seconds,
                                progress_for(options.progress, layout, datacenters, instance))
                try:  # on a thread of its own: a Ctrl-C during an in-process run must not be Dagster's alone
                    checks = run_stoppable(lambda stop: drain_and_verify(replace(drained, stop=stop), recoveries), log,
                                           "click-passes")
                finally:
                    for sensor in sensors:
                        instance.stop_sensor(sensor.get_remote_origin_id(), sensor.selector_id, sensor)
            runs = own_runs(instance, datacenters) - first_run
            summary = summarize(layout, datacenters, instance, pending_clicks(checks))
    summary.update(runs=runs, verification={check.name: check.passed for check in checks}, recoveries=recoveries,
                   wall_seconds=round(time.monotonic() - started, 2))
    return summary


def opened(instance: dg.DagsterInstance, layout: DataLayout, datacenters: list[str], log: logging.Logger
           ) -> tuple[int, list[dict]]:
    """What a start finds: runs a dead process left (failed, so their units are retried), their hand-off
    files (removed: none is alive, we hold the datacenters' locks; work unit ids start with their
    datacenter), and storage lost (recovered first). Returns the runs so far and the recoveries made."""
    orphans = fail_orphaned_runs(instance, datacenters)
    if orphans:
        log.warning("marked %d run(s) of a dead process as failed; their work units will be retried", orphans)
    for dc in datacenters:
        for leftover in layout.staging.glob(f"{dc}.*"):
            shutil.rmtree(leftover, ignore_errors=True)
    recoveries = []
    if storage_lost(layout):
        log.warning("data files of output tables are missing (storage loss): running recovery first")
        recoveries.append(recover(instance, log))
    return own_runs(instance, datacenters), recoveries


def drain_and_verify(d: "Drain", recoveries: list[dict]) -> list:
    """Drains, verifies; on a failed check, recovery and again (MAX_RECOVERY_ROUNDS); the checks' outcomes."""
    while True:
        drain(d)
        checks = verify(d.instance, d.layout)
        failed = sorted(check.name for check in checks if not check.passed)
        if not failed or len(recoveries) >= MAX_RECOVERY_ROUNDS:
            return checks
        d.log.warning("verification failed (%s): running the recovery job", ", ".join(failed))
        recoveries.append(recover(d.instance, d.log))
        if not recovery_did_work(recoveries[-1]):
            return checks


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
    datacenters, when it started and may go on until, the runs there were before it, and the
    supervisor of its children (its registry service, unless PHOTON_REGISTRY_ADDRESS names one, and
    its query tailers)."""

    instance: dg.DagsterInstance
    context: object
    sensors: list
    layout: DataLayout
    datacenters: list[str]
    log: logging.Logger
    started: float
    timeout_seconds: float
    first_run: int
    supervisor: Supervisor
    min_seconds: float = 0.0
    progress: Progress | None = None  # the line on a terminal (photon/progress_line.py)
    stop: threading.Event = field(default_factory=threading.Event)  # set by SIGINT/SIGTERM: end after this pass

    def runs(self) -> int:
        return own_runs(self.instance, self.datacenters)


def drain(d: Drain) -> None:
    """Sensor passes until IDLE_PASSES in a row launch nothing and nothing of these datacenters
    waits, and min_seconds have passed since the start. Each pass first looks at the children: a
    fatal one that exited (this process's own registry service: every run would fail until the
    timeout) stops it with one line; a query tailer is restarted."""
    with off_click_passes(d.context, d.log.getChild("sensors")), shown(d.progress, d.log):
        _drain(d)


def _drain(d: Drain) -> None:
    idle = 0
    while idle < IDLE_PASSES or time.monotonic() - d.started < d.min_seconds:
        if time.monotonic() - d.started > d.timeout_seconds:
            raise RunnerError(f"not idle after {d.timeout_seconds:.0f} s; state is kept, run again to continue")
        if d.stop.is_set():
            raise Stopped("stopped by a signal before idle, nothing verified; state is kept, run again to continue")
        d.supervisor.watch()
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


