"""`photon up`: the whole deployment on a data directory, as Dagster is run in production.

Components, each a process (group) of its own, each logging to `<data-dir>/state/up/<name>.log`:
- the registry service (`photon registry serve`, started as `photon run` starts it, photon/runner.py;
  it logs to `<data-dir>/state/registry.log`);
- a query tailer per datacenter (`photon event-store tail`, photon/tailers.py), feeding the
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
- `dagster-webserver`, the UI.

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

import fcntl
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from photon.runner import (
    RunnerError, die_with_parent, exclusive, fail_orphaned_runs, headless_instance, prepare_environment,
    datacenter_leases, query_tailers, registry_log, registry_service, run_server_socket, stop_if_exited, up_lock,
)
from photon.run_processes import kill_run_process, process_alive_since, run_process
from photon_assets.work_unit import TAG_DC, UNFINISHED
from resources.runtime.process_groups import stop_group
from resources.spark.connect_server import (free_port, server_command, server_environment, wait_until_listening,
                                             wait_until_serving)
from resources.spark.session import SPARK_REMOTE_ENV
from resources.state.layout import REPO_ROOT, DataLayout
from sensors.dispatcher import SENSORS_RUNNING_ENV

REAP_EVERY_SECONDS = 5.0
# A stop's budget, within 30 s: the daemon's SIGTERM to SIGKILL, the runs' grace to finish, then the
# other components' SIGTERM to SIGKILL (shared), then the query tailers and the registry service.
DAEMON_STOP_SECONDS = 5.0
GRACE_SECONDS = 12.0  # a click run takes a few seconds
STOP_SECONDS = 8.0
WEBSERVER_START_SECONDS = 180.0


@dataclass
class Component:
    name: str
    process: subprocess.Popen
    log: Path


def up_dir(layout: DataLayout) -> Path:
    return layout.root / "state" / "up"


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


def start(name: str, command: list[str], layout: DataLayout, env: dict[str, str] | None = None) -> Component:
    """A component in a new process group (its own children, such as the daemon's code server and
    run processes, share it, so one signal stops them all), ended by the kernel if `photon up` dies."""
    log = up_dir(layout) / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as output:
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env or dict(os.environ), stdout=output, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent,
        )
    return Component(name, process, log)


def stop(components: list[Component], log: logging.Logger, seconds: float = STOP_SECONDS) -> None:
    """Each component's process group stopped (stop_group), in order, sharing `seconds`."""
    for component in components:
        if component.process.poll() is None:
            log.info("stopping %s", component.name)
        stop_group(component.process, seconds / len(components))


def deployment_runs(instance: dg.DagsterInstance, datacenters: list[str], statuses) -> list[dg.DagsterRun]:
    """Runs of these datacenters, or of none (aggregates, checks, maintenance, freshness), in `statuses`."""
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


def shut_down(components: list[Component], instance: dg.DagsterInstance | None, datacenters: list[str],
              log: logging.Logger) -> None:
    """The daemon stopped, the runs ended (end_runs), then the other components, in order."""
    ordered = sorted(components, key=lambda c: STOP_ORDER.index(c.name))
    daemons = [c for c in ordered if c.name == "dagster-daemon"]
    stop(daemons, log, DAEMON_STOP_SECONDS)
    if instance is not None and daemons:
        end_runs(instance, datacenters, log)
    stop([c for c in ordered if c not in daemons], log)


def wait_for_webserver(url: str, webserver: Component) -> None:
    deadline = time.monotonic() + WEBSERVER_START_SECONDS
    while time.monotonic() < deadline:
        stop_if_exited(webserver.name, webserver.process, webserver.log)
        try:
            with urllib.request.urlopen(f"{url}/server_info", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise RunnerError(f"dagster-webserver did not serve within {WEBSERVER_START_SECONDS:.0f} s; see {webserver.log}")


RUN_SERVER_START_SECONDS = 60.0
CODE_SERVER_START_SECONDS = 180.0  # loading the code location: imports and definitions, on two cores


def wait_for_run_server(socket_path: Path, run_server: Component) -> None:
    deadline = time.monotonic() + RUN_SERVER_START_SECONDS
    while not socket_path.exists():
        stop_if_exited(run_server.name, run_server.process, run_server.log)
        if time.monotonic() > deadline:
            raise RunnerError(f"the run server did not listen within {RUN_SERVER_START_SECONDS:.0f} s; "
                              f"see {run_server.log}")
        time.sleep(0.1)


def fail_dead_runs(instance: dg.DagsterInstance, datacenters: list[str]) -> list[str]:
    """Started runs of these datacenters, or of none (the freshness check's, the aggregates refresh,
    table maintenance), whose process is gone (killed: Dagster's default run launcher has no health
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


def start_spark_connect(layout: DataLayout, spark_master: str) -> tuple[Component, str]:
    """The deployment's Spark Connect server, started (not yet serving: see wait_until_serving), and its URL."""
    spark_port = free_port()
    remote = f"sc://127.0.0.1:{spark_port}"
    return start("spark-connect", server_command(spark_port, master=spark_master), layout, server_environment()), remote


def start_code_server(layout: DataLayout, env: dict[str, str]) -> tuple[Component, int, Path]:
    """The deployment's code server, started (serving once wait_for_code_server returns), its port,
    and the workspace file that points the daemon and the webserver at it."""
    port = free_port()
    server = start("code-server", [str(Path(sys.executable).parent / "dagster"), "api", "grpc", "--host", "127.0.0.1",
                                   "--port", str(port), "--module-name", "definitions", "--working-directory",
                                   str(REPO_ROOT), "--location-name", "photon"], layout, env)
    workspace = up_dir(layout) / "workspace.yaml"
    workspace.write_text("# Written by `photon up` at each start: the code server it started (photon/up.py).\n"
                         "load_from:\n  - grpc_server:\n      host: 127.0.0.1\n"
                         f"      port: {port}\n      location_name: photon\n")
    return server, port, workspace


def wait_for_code_server(port: int, server: Component) -> None:
    """Returns once the code server accepts connections: it binds its port only after loading the
    code location, so a daemon or webserver started then finds it loaded."""
    try:
        wait_until_listening("127.0.0.1", port, lambda: stop_if_exited(server.name, server.process, server.log),
                             CODE_SERVER_START_SECONDS, "the code server")
    except RunnerError:  # it exited: stop_if_exited's line names it and its log
        raise
    except RuntimeError as error:  # the time ran out
        raise RunnerError(f"{error}; see {server.log}") from None


# The order a stop goes in (shut_down): no new runs, the runs, the UI and the code server, then Spark.
STOP_ORDER = ("dagster-daemon", "run-server", "dagster-webserver", "code-server", "spark-connect")


def start_components(layout: DataLayout, remote: str, port: int, components: list[Component],
                     log: logging.Logger) -> str:
    """The run server, the code server, the webserver and the daemon, started beside Spark Connect
    (`components`' first; each is seconds of JVM start or imports on two cores): the webserver and the
    daemon wait for the code server, and the daemon for Spark to serve and the run server to listen,
    since it launches runs at once. Adds each to `components`; returns the UI's URL."""
    spark = components[0]
    env = {**os.environ, SPARK_REMOTE_ENV: remote, SENSORS_RUNNING_ENV: "1"}
    bin_dir = Path(sys.executable).parent
    # Runs are forks of the run server (photon/run_server.py), in its process group: stopped right
    # after the daemon (no new runs), before the UI and Spark.
    socket_path = run_server_socket(layout)
    run_server = start("run-server", [sys.executable, "-m", "photon.run_server", str(socket_path)], layout, env)
    components.append(run_server)
    code_server, code_port, workspace = start_code_server(layout, env)
    components.append(code_server)
    wait_for_code_server(code_port, code_server)
    webserver = start("dagster-webserver", [str(bin_dir / "dagster-webserver"), "-w", str(workspace),
                                            "-h", "127.0.0.1", "-p", str(port)], layout, env)
    components.append(webserver)
    wait_until_serving(remote, spark.process)
    log.info("Spark Connect server at %s", remote)
    wait_for_run_server(socket_path, run_server)
    components.append(start("dagster-daemon", [str(bin_dir / "dagster-daemon"), "run", "-w", str(workspace)],
                            layout, env))
    url = f"http://127.0.0.1:{port}"
    wait_for_webserver(url, webserver)
    return url


def bring_up(layout: DataLayout, datacenters: list[str], port: int, spark_master: str, log: logging.Logger,
             ready=print) -> int:
    """Runs the deployment until SIGINT/SIGTERM (exit 0) or until a component exits (exit 1)."""
    stopping = []

    def on_signal(signum, _frame):
        stopping.append(signum)

    prepare_environment(layout, datacenters, run_log_level="INFO")
    components: list[Component] = []
    instance = None
    with ExitStack() as held:
        held.enter_context(only_one_up(layout))
        held.enter_context(exclusive(layout, datacenters))
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        try:
            instance = headless_instance(layout)
            orphans = fail_orphaned_runs(instance, datacenters)
            if orphans:
                log.warning("marked %d run(s) cut short earlier as failed; their work units will be retried", orphans)
            # Spark's JVM starts first: it takes longest, and needs nothing of the rest.
            spark, remote = start_spark_connect(layout, spark_master)
            components.append(spark)
            registry = held.enter_context(registry_service(layout, log))
            held.enter_context(datacenter_leases(layout, datacenters, log))
            tailers = held.enter_context(query_tailers(layout, datacenters, log))
            url = start_components(layout, remote, port, components, log)
            ready(f"photon up: {url} (data {layout.root}; logs {up_dir(layout)}); Ctrl-C stops", flush=True)
            # The registry service is stopped last, by registry_service, after the runs that use it.
            watched = [*components, *([Component("registry", registry, registry_log(layout))] if registry else [])]
            reaped = time.monotonic()
            while not stopping:
                for component in watched:
                    stop_if_exited(component.name, component.process, component.log)
                tailers.watch()
                if time.monotonic() - reaped > REAP_EVERY_SECONDS:
                    for run_id in fail_dead_runs(instance, datacenters):
                        log.warning("run %s: its process died; marked failed, its work unit will be retried", run_id)
                    reaped = time.monotonic()
                time.sleep(0.5)
            log.info("signal %d: stopping", stopping[0])
            return 0
        finally:
            shut_down(components, instance, datacenters, log)
