"""Runs that start in a fraction of a second under the daemon: a fork server and the run launcher that
uses it (issue 42, item 3).

Dagster's default run launcher asks the code server to start each run in a new Python process, which
imports Dagster, the code location and the Spark Connect client before its first Spark job: 6-20 s
on two busy cores, 3.5-4 s of CPU a run. `photon up` instead starts one warm process,
`python -m photon.run_server`, that has imported all of that once (and opened the instance once, then
closed it; it holds nothing open: no instance, no Spark session, no thread, so that a fork of it is
safe), listens on a Unix socket under the data
directory, and forks a child per run. The child opens the instance and executes the run exactly as
`dagster api execute_run` does (`_execute_run_command_body`: the run's events, its engine event with
the pid, its cancellation thread), then exits.

`ForkServerRunLauncher` is the run launcher the instance's `dagster.yaml` names: the daemon, the
webserver and the code servers load it. It sends the run id to the socket at
PHOTON_RUN_SERVER_SOCKET and receives the child's pid; with no fork server there (`dagster dev`
without `photon up`, or one that died) it launches as Dagster's default launcher does. Runs stay real
Dagster runs: queued by the run coordinator, shown in the UI with their events. Termination is a
SIGTERM to the child, which Dagster's execution turns into a canceled run; a child that died is seen
by run monitoring through `check_run_worker_health` (and by `photon up`'s own watch), and its work
unit is retried as before.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any, Mapping

from dagster import Field, StringSource
from dagster._core.launcher import CheckRunHealthResult, DefaultRunLauncher, LaunchRunContext, WorkerStatus
from dagster._serdes import ConfigurableClassData

from photon.run_processes import process_alive_since, run_process
from resources.runtime.forking import freeze_before_fork
from resources.runtime.priority import lower_this_process

SOCKET_ENV = "PHOTON_RUN_SERVER_SOCKET"
log = logging.getLogger(__name__)


class ForkServerRunLauncher(DefaultRunLauncher):
    """Launches each run as a fork of the warm run server (see the module docstring)."""

    def __init__(self, socket_path: str | None = None, inst_data: ConfigurableClassData | None = None):
        super().__init__(inst_data=inst_data)
        self.socket_path = socket_path or None

    @classmethod
    def config_type(cls) -> dict:
        return {"socket_path": Field(StringSource, is_required=False)}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]):
        return cls(socket_path=config_value.get("socket_path"), inst_data=inst_data)

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        path = self.socket_path
        if path and Path(path).exists():
            try:
                pid = request_run(path, run.run_id)
            except OSError as error:  # the server is gone or stopping: the default way still works
                log.warning("run server at %s unavailable (%s); launching run %s the default way", path, error,
                            run.run_id)
            else:
                self._run_ids.add(run.run_id)
                self._instance.report_engine_event(f"Forked by the run server (pid {pid}).", run, cls=self.__class__)
                return
        super().launch_run(context)

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        process = run_process(self._instance, run_id) if run else None
        if run is None or run.is_finished or process is None or not process_alive_since(*process):
            return super().terminate(run_id)
        self._instance.report_run_canceling(run)
        os.kill(process[0], signal.SIGTERM)  # Dagster's execution turns it into a canceled run
        return True

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run) -> CheckRunHealthResult:
        process = run_process(self._instance, run.run_id)
        if process is None:
            return CheckRunHealthResult(WorkerStatus.UNKNOWN, "its process has not logged its pid yet")
        if process_alive_since(*process):
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        return CheckRunHealthResult(WorkerStatus.FAILED, f"its process (pid {process[0]}) is gone")


def request_run(path: str, run_id: str, timeout_seconds: float = 10.0) -> int:
    """Asks the run server at `path` to fork run `run_id`; returns the child's pid."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout_seconds)
        conn.connect(path)
        conn.sendall(json.dumps({"run_id": run_id}).encode() + b"\n")
        answer = json.loads(conn.makefile("rb").readline() or b"{}")
    if "pid" not in answer:
        raise OSError(f"the run server answered {answer}")
    return int(answer["pid"])


def _execute(run_id: str) -> int:
    """In the forked child: the run, as `dagster api execute_run` executes it (SIGTERM and SIGINT
    interrupt it the way Dagster's own run processes are interrupted); a run off the click path at a
    lower CPU priority (resources/runtime/priority.py)."""
    import dagster as dg
    from dagster._cli.api import _execute_run_command_body
    from dagster._utils.interrupts import capture_interrupts

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    with capture_interrupts(), dg.DagsterInstance.get() as instance:
        lower_if_off_click_path(instance.get_run_by_id(run_id))
        return _execute_run_command_body(run_id, instance, lambda event: None, set_exit_code_on_failure=False)


def lower_if_off_click_path(run) -> None:
    """This run's process at the lower CPU priority of the work off the click path, unless it is a run
    of the click path (new click lines, pending retries): query runs, the aggregates refresh, table
    maintenance and checks, recovery. In the forked child, before the run starts its threads."""
    # Imported here, where the warm server has it already: the daemon and the webserver load this
    # module for its launcher and have no use for the pipeline's modules.
    from photon_assets.jobs import JOIN_CLICKS_JOB

    if run is not None and run.job_name != JOIN_CLICKS_JOB:
        lower_this_process()


# How long a run child waits for its session's release before it exits anyway.
RELEASE_SECONDS = 10.0


def release_spark_session(seconds: float = RELEASE_SECONDS) -> None:
    """The Spark Connect session this process's run opened, released on the server. A process that
    just exits leaves it there until the server's idle timeout (an hour, Spark's default), with what
    it holds (its configuration, its Hadoop configuration's ~2,000 entries): 0.2-0.3 MB of the
    server's heap a session, and `photon up` opens ~1,000 an hour at 1,000 clicks/s (docs/STACK.md,
    Spark Connect). pyspark's `stop` is best effort: it logs what it could not do. It is one attempt
    within `seconds`: with the client's retry policy, a release to a server that is gone (killed with
    the `photon up` that started it) retried for ~10 minutes, and the run's process, its run ended,
    lived on as long."""
    import threading

    from pyspark.sql.connect.session import SparkSession

    session = SparkSession.getActiveSession()
    if session is None:
        return
    session.client.set_retry_policies([])
    release = threading.Thread(target=session.stop, name="release-spark-session", daemon=True)
    release.start()
    release.join(seconds)
    if release.is_alive():
        log.warning("the Spark session was not released within %.0f s; the server ends it when idle", seconds)


# The code location's module, as the workspace names it (workspace.yaml; photon/runner.py: workspace).
CODE_LOCATION_MODULE = "definitions"


def _warm_up() -> None:
    """What every run imports: Dagster, the code location (loaded by its module's name, as Dagster
    loads it for a run; it builds the Definitions from the environment, and its repository is resolved
    here once) and the Spark Connect client; and the instance, opened once and closed: its first open
    imports its storages (~430 modules, 0.7-2 s of each run's start on two busy cores) and holds no
    connection or thread once closed, so the process still opens nothing that a fork would share; and
    alembic's revision scripts, read once (photon/sqlite_storage.py: event_log_scripts)."""
    import importlib

    import dagster as dg
    import dagster._cli.api  # noqa: F401
    import pyspark.sql.connect.session  # noqa: F401

    from photon.sqlite_storage import event_log_scripts

    importlib.import_module(CODE_LOCATION_MODULE).defs.get_repository_def()
    with dg.DagsterInstance.get():
        pass
    event_log_scripts()  # alembic's revision map, which each run's new event database is stamped from


def private_directory(directory: Path) -> None:
    """The socket's directory, this user's alone: whoever can connect to the socket starts runs (the
    data directory's, or one under the shared temporary directory: photon/deployment.py,
    run_server_socket)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    owner = directory.stat().st_uid
    if owner != os.getuid():
        raise SystemExit(f"photon: error: the run server's directory {directory} belongs to uid {owner}, not to this user")


def serve(path: Path) -> None:
    """Forks a child per request until SIGTERM. Children are reaped by the kernel (SIGCHLD ignored);
    they stay in this process's group, so a signal to it reaches the runs too."""
    _warm_up()
    freeze_before_fork()
    private_directory(path.parent)
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"run server at {path}", flush=True)
    try:
        while True:
            conn, _ = listener.accept()
            with conn:
                request = json.loads(conn.makefile("rb").readline() or b"{}")
                freeze_before_fork()  # what this loop made since, too
                pid = os.fork()
                if pid == 0:  # the child: the run, then exit without this process's cleanup
                    listener.close()
                    conn.close()
                    code = 1
                    try:
                        code = _execute(request["run_id"])
                    except BaseException:  # noqa: BLE001 - whatever it was is in the run's events
                        log.exception("run %s failed to execute", request.get("run_id"))
                    finally:
                        try:
                            release_spark_session()
                        except BaseException:  # noqa: BLE001 - the child must reach its exit below
                            log.exception("run %s: its Spark session was not released", request.get("run_id"))
                        sys.stdout.flush()
                        sys.stderr.flush()
                        os._exit(code)
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    finally:
        listener.close()
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    serve(Path(sys.argv[1]))
