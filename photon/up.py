"""`photon up`: the whole deployment on a data directory, as Dagster is run in production.

Components, each a process (group) of its own, each logging to `<data-dir>/state/up/<name>.log`, each
a row of photon/components.py's table, started, watched and stopped by photon/supervisor.py:
- the registry service (`photon registry serve`, started as `photon run` starts it; it logs to
  `<data-dir>/state/registry.log`);
- a query tailer per datacenter (`photon event-store tail`, photon/query_tail.py), feeding the
  EventStore's memory tier in the registry service as query bytes land; restarted if it exits, since
  it resumes where the registry service says it was (`<data-dir>/state/query_tail_<dc>.log`);
- a Spark Connect server with Delta (resources/spark/connect_server.py): the long-lived Spark every run
  uses, so a run in a process of its own connects in ~0.3 s instead of starting a JVM;
- a run server (photon/run_server.py): one warm process that imported Dagster, the code location and
  the Spark Connect client, forking a child per run (`ForkServerRunLauncher`, named by the instance's
  `dagster.yaml`): a run reaches its first Spark job without a new interpreter's imports;
- a code server (`dagster api grpc`): the code location loaded once, which the daemon (sensor ticks)
  and the webserver both query, through a workspace file naming it (`<data-dir>/state/up/workspace.yaml`).
  Given a `python_module` workspace instead, each spawns a code server of its own, and the daemon
  replaces its own every 60 s (Dagster's RELOAD_WORKSPACE_INTERVAL): at 1,000 clicks/s those reloads
  cost ~29 % of a core of a two-core machine (a live `photon up` of 2026-11-28). Code changes take a
  restart of `photon up`;
- `dagster-daemon`, with the dispatchers running (they are stopped by default elsewhere), launching
  each run through the run server;
- `dagster-webserver`, the UI;
- and in its own process, a thread posting the alerts the sensors queue to PHOTON_ALERT_WEBHOOK (photon/alert_sender.py).

A component that exits (but a query tailer) stops the whole deployment with a one-line error naming it and its log
(`photon up` does not restart it: a deployment that heals silently hides a crash loop). SIGINT or
SIGTERM (to `photon up` or to its whole process group, as a terminal or systemd sends it) stops it
within 30 s: the daemon first (no new runs), then the runs in flight get GRACE_SECONDS to finish, and
those left, running or queued, are killed and marked canceled (a stop, not an incident: their work
units are retried at the next start, safe by the exactly-once machinery); then the run server, the UI, the code server,
Spark, the query tailers and last the registry service, so that nothing still running meets a
component already stopped. A run cut short by a `photon up` killed with SIGKILL is marked failed when
`photon up` (or `photon run`) next starts on the directory, its process killed first, and its work unit
is retried: stopping loses nothing. While up, a run whose process died (killed, out of memory) is marked
failed within seconds (`fail_dead_runs`), and retried.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from contextlib import ExitStack
from pathlib import Path

import dagster as dg

from photon.alert_sender import alert_sender
from photon.components import Launch, query_tailers, spark_connect_launch, start_component
from photon.deployment import (
    datacenter_leases, exclusive, fail_orphaned_runs, headless_instance, only_one_up, prepare_environment,
)
from photon.query_tail import TailSettings
from photon.registry_cluster import registry_for
from photon.run_processes import kill_run_process, process_alive_since, run_process
from photon.supervisor import Supervisor
from photon_assets.work_unit import TAG_DC, UNFINISHED
from resources.settings import pipeline_settings
from resources.spark.connect_server import free_port
from resources.spark.session import SPARK_REMOTE_ENV
from resources.state.layout import DataLayout
from sensors.alerts import UI_URL_ENV
from sensors.dispatcher import SENSORS_RUNNING_ENV

REAP_EVERY_SECONDS = 5.0
# A stop's budget, within 30 s: the daemon's SIGTERM to SIGKILL (its row's 5 s), the runs' grace to
# finish, then the other components' SIGTERM to SIGKILL (their rows' seconds; what exits at once costs
# nothing), the query tailers and last the registry service.
GRACE_SECONDS = 12.0  # a click run takes a few seconds


def up_dir(layout: DataLayout) -> Path:
    return layout.root / "state" / "up"


def deployment_runs(instance: dg.DagsterInstance, datacenters: list[str], statuses) -> list[dg.DagsterRun]:
    """Runs of these datacenters, or of none (aggregates, checks, maintenance), in `statuses`."""
    return [run for run in instance.get_runs(dg.RunsFilter(statuses=list(statuses)))
            if run.tags.get(TAG_DC) in (None, *datacenters)]


def end_runs(instance: dg.DagsterInstance, datacenters: list[str], log: logging.Logger) -> None:
    """Once the daemon has stopped (no run is launched any more): the runs under way get GRACE_SECONDS to
    finish; each run left, running or queued, is killed and marked canceled."""
    running = (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED)
    deadline = time.monotonic() + GRACE_SECONDS
    while deployment_runs(instance, datacenters, running) and time.monotonic() < deadline:
        time.sleep(0.25)
    for run in deployment_runs(instance, datacenters, UNFINISHED):
        kill_run_process(instance, run.run_id)
        if instance.get_run_by_id(run.run_id).status in UNFINISHED:  # it may have finished meanwhile
            instance.report_run_canceled(run, "photon up stopped before this run finished; its work unit is "
                                              "retried at the next start")
            log.info("run %s (%s) canceled by the stop", run.run_id, run.job_name)


def fail_dead_runs(instance: dg.DagsterInstance, datacenters: list[str]) -> list[str]:
    """Started runs of these datacenters, or of none (the table checks, the aggregates refresh, table
    maintenance), whose process is gone (killed: Dagster's default run launcher has no health
    check, and such a run would stay started for good) are marked failed, so that the dispatchers
    retry their work units and the runs of a sensor with a concurrency limit of one are launched
    again. Returns their run ids."""
    failed = []
    for run in instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])):
        dc = run.tags.get(TAG_DC)
        if dc is not None and dc not in datacenters:
            continue
        process = run_process(instance, run.run_id)
        if process is None or process_alive_since(*process):
            continue
        # It may have finished between the two reads: only a run still started is failed.
        if instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED:
            instance.report_run_failed(run, f"its process (pid {process[0]}) died")
            failed.append(run.run_id)
    return failed


def shut_down(supervisor: Supervisor, instance: dg.DagsterInstance | None, datacenters: list[str],
              log: logging.Logger) -> None:
    """The daemon stopped (no new run), the runs ended (end_runs), then the components started after
    the registry's leases, in stop order; the tailers and the registry stop once the leases are
    released (bring_up's ExitStack)."""
    daemon = [name for name in supervisor.children if name == "dagster-daemon"]
    supervisor.stop(daemon)
    if instance is not None and daemon:
        end_runs(instance, datacenters, log)
    supervisor.stop([name for name in supervisor.children if name in DEPLOYMENT])


# The components `photon up` starts besides what `photon run` starts too (the registry, the tailers).
DEPLOYMENT = ("run-server", "code-server", "dagster-webserver", "dagster-daemon", "spark-connect")


def write_workspace(layout: DataLayout, port: int) -> Path:
    """The workspace file that points the daemon and the webserver at the code server on `port`."""
    workspace = up_dir(layout) / "workspace.yaml"
    workspace.parent.mkdir(parents=True, exist_ok=True)
    workspace.write_text("# Written by `photon up` at each start: the code server it started (photon/up.py).\n"
                         "load_from:\n  - grpc_server:\n      host: 127.0.0.1\n"
                         f"      port: {port}\n      location_name: photon\n")
    return workspace


def start_components(supervisor: Supervisor, layout: DataLayout, remote: str, port: int) -> str:
    """The run server, the code server, the webserver and the daemon, started beside Spark Connect
    (already starting: each is seconds of JVM start or imports on two cores): the webserver and the
    daemon wait for the code server, and the daemon for Spark to serve and the run server to listen,
    since it launches runs at once. Returns the UI's URL."""
    # The alert sensor's messages link to the UI (sensors/alerts.py).
    env = {**os.environ, SPARK_REMOTE_ENV: remote, SENSORS_RUNNING_ENV: "1", UI_URL_ENV: f"http://127.0.0.1:{port}"}
    # Runs are forks of the run server (photon/run_server.py), in its process group: stopped right
    # after the daemon (no new runs), before the UI and Spark.
    start_component(supervisor, "run-server", Launch(layout, env))
    code_port = free_port()
    workspace = write_workspace(layout, code_port)
    start_component(supervisor, "code-server", Launch(layout, env, port=code_port))
    supervisor.wait_ready("code-server")
    start_component(supervisor, "dagster-webserver", Launch(layout, env, port=port, options={"workspace": workspace}))
    supervisor.wait_ready("spark-connect")
    supervisor.log.info("Spark Connect server at %s", remote)
    supervisor.wait_ready("run-server")
    start_component(supervisor, "dagster-daemon", Launch(layout, env, options={"workspace": workspace}))
    supervisor.wait_ready("dagster-webserver")
    return f"http://127.0.0.1:{port}"


def bring_up(layout: DataLayout, datacenters: list[str], port: int, spark_master: str, log: logging.Logger,
             ready=print, registry_replicas: int | None = None) -> int:
    """Runs the deployment until SIGINT/SIGTERM (exit 0) or until a fatal component exits (exit 1)."""
    stopping = []

    def on_signal(signum, _frame):
        stopping.append(signum)

    prepare_environment(layout, datacenters, run_log_level="INFO")
    instance = None
    with ExitStack() as held:
        held.enter_context(only_one_up(layout))
        held.enter_context(exclusive(layout, datacenters))
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        supervisor = held.enter_context(Supervisor(log))
        try:
            instance = headless_instance(layout)
            orphans = fail_orphaned_runs(instance, datacenters)
            if orphans:
                log.warning("marked %d run(s) cut short earlier as failed; their work units will be retried", orphans)
            # Spark's JVM starts first: it takes longest, and needs nothing of the rest.
            spark_port = free_port()
            start_component(supervisor, "spark-connect", spark_connect_launch(layout, spark_port, spark_master))
            held.enter_context(registry_for(supervisor, layout, registry_replicas))
            held.enter_context(datacenter_leases(layout, datacenters, log))
            held.enter_context(query_tailers(supervisor, layout, datacenters,
                                             TailSettings.of(pipeline_settings()).to_json()))
            url = start_components(supervisor, layout, f"sc://127.0.0.1:{spark_port}", port)
            held.enter_context(alert_sender(layout.alerts_dir, log))
            ready(f"photon up: {url} (data {layout.root}; logs {up_dir(layout)}); Ctrl-C stops", flush=True)
            reaped = time.monotonic()
            while not stopping:
                supervisor.watch()
                if time.monotonic() - reaped > REAP_EVERY_SECONDS:
                    for run_id in fail_dead_runs(instance, datacenters):
                        log.warning("run %s: its process died; marked failed, its work unit will be retried", run_id)
                    reaped = time.monotonic()
                time.sleep(0.5)
            log.info("signal %d: stopping", stopping[0])
            return 0
        finally:
            shut_down(supervisor, instance, datacenters, log)
