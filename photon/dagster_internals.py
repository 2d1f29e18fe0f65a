"""Every Dagster internal this project relies on, in one place: Dagster has no public API to run its
sensor daemon's iteration in process, or to open an instance with overrides.

- `sensor_pass`: the daemon's own sensor iteration (`dagster._daemon.sensor.execute_sensor_iteration`),
  so that ticks, cursors, run keys and tick resumption behave in `photon run` exactly as under
  `dagster-daemon`; the daemon's shuffle of a pass's sensors (`shuffled_round_robin_by_key`, for
  fairness between code locations) is replaced by a fixed order for the pass, and its minimum
  interval check (`is_under_min_interval`) lets every sensor due at the pass's pace tick: the daemon
  measures a sensor's interval from its last tick's start, so in passes a second apart a sensor
  ticked late in one pass would be skipped in the next. The order may return a subset of the
  sensors: only those tick (photon run ticks its query dispatchers on a thread of their own).
- `in_process_workspace` / `remote_sensors`: the code location loaded in this process.
- `instance_at`: the data directory's instance, with `photon run`'s in-process run launcher
  (`SyncInMemoryRunLauncher`), immediate run coordinator and no capture of steps' stdout and stderr
  when asked.
- `runs_on_several_threads`: each run's log manager calls `logging.config.dictConfig` even when the
  instance configures no Python log handlers (`EventMethods.get_yaml_python_handlers`). dictConfig
  takes the logging module's lock and then every handler's, while a run on another thread emitting
  an event holds its handler's lock and asks for the module's: `photon run`'s two run threads
  deadlocked so. With no handler configured, no dictConfig is needed.

tests/photon/test_dagster_internals.py fails, naming what changed, when a Dagster upgrade moves or
changes any of them.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import dagster._daemon.sensor as sensor_daemon
from dagster._core.instance.ref import InstanceRef
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget

IN_PROCESS_RUNS = {
    "run_launcher": {
        "module": "dagster._core.launcher.sync_in_memory_run_launcher",
        "class": "SyncInMemoryRunLauncher",
    },
    "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"},
    # A step's stdout and stderr are captured by pointing the process's file descriptors 1 and 2 at a
    # file for the step: with runs on two threads (photon/runner.py: off_click_passes) each capture would
    # restore the other's file as the "original", and the process's own output went into a step's
    # log for good. Run events, logs and metadata are stored as usual.
    "compute_logs": {"module": "dagster._core.storage.noop_compute_log_manager", "class": "NoOpComputeLogManager"},
}


def runs_on_several_threads() -> None:
    """Lets runs execute on several threads of this process (see the module docstring); idempotent."""
    from dagster._core.instance.methods.event_methods import EventMethods

    original = EventMethods.get_yaml_python_handlers
    if getattr(original, "photon_patched", False):
        return

    def yaml_python_handlers(self):
        configured = self._settings_impl and self._instance.get_python_log_dagster_handler_config()
        return original(self) if configured else []

    yaml_python_handlers.photon_patched = True
    EventMethods.get_yaml_python_handlers = yaml_python_handlers


def instance_at(dagster_home: Path, in_process_runs: bool = False) -> dg.DagsterInstance:
    overrides = IN_PROCESS_RUNS if in_process_runs else None
    return dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home), overrides=overrides))


def in_process_workspace(instance: dg.DagsterInstance, module_name: str, working_directory: Path,
                         location_name: str) -> WorkspaceProcessContext:
    origin = InProcessCodeLocationOrigin(
        loadable_target_origin=LoadableTargetOrigin(
            executable_path=sys.executable, module_name=module_name, working_directory=str(working_directory)
        ),
        location_name=location_name,
    )
    return WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget(origin))


def remote_sensors(context: WorkspaceProcessContext) -> tuple[list, list[str]]:
    """The loaded code locations' sensors, and the load errors of those that failed to load."""
    sensors, errors = [], []
    for entry in context.create_request_context().get_code_location_entries().values():
        if entry.load_error:
            errors.append(entry.load_error.message.strip())
            continue
        for repo in entry.code_location.get_repositories().values():
            sensors.extend(repo.get_sensors())
    return sensors, errors


# The daemon's module functions are replaced while any thread runs a pass (photon run ticks its query
# dispatchers on a thread of their own); each thread's pass brings its own order and pace, and a
# thread running none gets the daemon's own behaviour.
_rules = threading.local()
_installed = {"count": 0}
_install_lock = threading.Lock()
_ORIGINAL = {"shuffle": sensor_daemon.shuffled_round_robin_by_key, "under": sensor_daemon.is_under_min_interval}


def _ordered(sensors, key):
    order = getattr(_rules, "order", None)
    return order(list(sensors)) if order else _ORIGINAL["shuffle"](sensors, key)


def _under_interval(state, sensor, *args, **kwargs) -> bool:
    pace = getattr(_rules, "pace", None)
    if pace is not None and (sensor.min_interval_seconds or 0) <= pace:
        return False
    return _ORIGINAL["under"](state, sensor, *args, **kwargs)


@contextmanager
def _pass_rules(order: Callable[[list], list], pace_seconds: float):
    with _install_lock:
        if _installed["count"] == 0:
            sensor_daemon.shuffled_round_robin_by_key, sensor_daemon.is_under_min_interval = _ordered, _under_interval
        _installed["count"] += 1
    _rules.order, _rules.pace = order, pace_seconds
    try:
        yield
    finally:
        _rules.order = _rules.pace = None
        with _install_lock:
            _installed["count"] -= 1
            if _installed["count"] == 0:
                sensor_daemon.shuffled_round_robin_by_key = _ORIGINAL["shuffle"]
                sensor_daemon.is_under_min_interval = _ORIGINAL["under"]


def sensor_pass(context: WorkspaceProcessContext, logger: logging.Logger, order: Callable[[list], list],
                pace_seconds: float) -> None:
    """One iteration of the daemon's sensor loop, synchronously, in `order`: every running sensor
    whose minimum interval is at most `pace_seconds` (the caller's passes are that far apart) ticks,
    the others when their interval has passed."""
    with _pass_rules(order, pace_seconds):
        for _ in sensor_daemon.execute_sensor_iteration(
            context, logger, threadpool_executor=None, submit_threadpool_executor=None
        ):
            pass
