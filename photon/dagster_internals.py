"""Every Dagster internal this project relies on, in one place: Dagster has no public API to run its
sensor daemon's iteration in process, or to open an instance with overrides.

- `sensor_pass`: the daemon's own sensor iteration (`dagster._daemon.sensor.execute_sensor_iteration`),
  so that ticks, cursors, run keys and tick resumption behave in `photon run` exactly as under
  `dagster-daemon`; the daemon's shuffle of a pass's sensors (`shuffled_round_robin_by_key`, for
  fairness between code locations) is replaced by a fixed order for the pass, and its minimum
  interval check (`is_under_min_interval`) lets every sensor due at the pass's pace tick: the daemon
  measures a sensor's interval from its last tick's start, so in passes a second apart a sensor
  ticked late in one pass would be skipped in the next.
- `in_process_workspace` / `remote_sensors`: the code location loaded in this process.
- `instance_at`: the data directory's instance, with `photon run`'s in-process run launcher
  (`SyncInMemoryRunLauncher`) and immediate run coordinator when asked.

tests/photon/test_dagster_internals.py fails, naming what changed, when a Dagster upgrade moves or
changes any of them.
"""

from __future__ import annotations

import logging
import sys
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
}


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


@contextmanager
def _pass_rules(order: Callable[[list], list], pace_seconds: float):
    shuffle, under_interval = sensor_daemon.shuffled_round_robin_by_key, sensor_daemon.is_under_min_interval
    sensor_daemon.shuffled_round_robin_by_key = lambda sensors, key: order(list(sensors))
    sensor_daemon.is_under_min_interval = lambda state, sensor, *args, **kwargs: (
        (sensor.min_interval_seconds or 0) > pace_seconds and under_interval(state, sensor, *args, **kwargs))
    try:
        yield
    finally:
        sensor_daemon.shuffled_round_robin_by_key, sensor_daemon.is_under_min_interval = shuffle, under_interval


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
