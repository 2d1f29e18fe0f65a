"""Fails loudly, naming what changed, when a Dagster upgrade moves or changes one of the internals
photon/dagster_internals.py relies on (an import error names a moved one)."""

import inspect
import logging
import time

import dagster._daemon.sensor as sensor_daemon

from photon.dagster_internals import in_process_workspace, instance_at, remote_sensors, sensor_pass
from photon.deployment import instance_yaml
from photon.runner import PASS_INTERVAL_SECONDS
from resources.state.layout import DATA_DIR_ENV, REPO_ROOT


def test_the_daemon_sensor_iteration_takes_what_sensor_pass_passes():
    parameters = list(inspect.signature(sensor_daemon.execute_sensor_iteration).parameters)
    assert parameters[:2] == ["workspace_process_context", "logger"], parameters
    assert {"threadpool_executor", "submit_threadpool_executor"} <= set(parameters), parameters


def test_the_daemon_orders_a_pass_through_the_function_sensor_pass_replaces():
    assert "shuffled_round_robin_by_key(" in inspect.getsource(sensor_daemon.execute_sensor_iteration)


def test_in_process_runs_override_the_data_directorys_queued_daemon_runs(tmp_path):
    (tmp_path / "dagster.yaml").write_text(instance_yaml(tmp_path, tmp_path / "run.sock"))
    assert type(instance_at(tmp_path).run_coordinator).__name__ == "QueuedRunCoordinator"
    instance = instance_at(tmp_path, in_process_runs=True)
    assert type(instance.run_launcher).__name__ == "SyncInMemoryRunLauncher"
    assert type(instance.run_coordinator).__name__ != "QueuedRunCoordinator"  # launched at once


def test_the_code_location_loads_in_process_with_its_dispatchers(tmp_path, monkeypatch):
    (tmp_path / "logs" / "dc1").mkdir(parents=True)
    (tmp_path / "dagster").mkdir()
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    with in_process_workspace(instance_at(tmp_path / "dagster"), "definitions", REPO_ROOT, "photon") as context:
        sensors, errors = remote_sensors(context)
    assert errors == []
    assert sorted(s.name for s in sensors) == [
        "click_aggregates_refresher", "click_log_dispatcher_dc1",
        "pending_click_dispatcher_dc1", "photon_alerts", "query_log_dispatcher_dc1", "table_checker", "table_maintenance",
    ]


def test_the_daemon_skips_a_sensor_through_the_interval_check_sensor_pass_replaces():
    assert "is_under_min_interval(" in inspect.getsource(sensor_daemon.execute_sensor_iteration)
    assert list(inspect.signature(sensor_daemon.is_under_min_interval).parameters)[:2] == ["state", "remote_sensor"]


def test_every_sensor_due_at_the_pace_ticks_in_each_pass(tmp_path, monkeypatch):
    """Passes a pace apart: the daemon alone would skip, in the second, every sensor whose tick in the
    first started less than its one-second interval before it (all but the first few). Sensors of a
    longer interval (the upkeep sensors: 15 s) tick when it has passed."""
    (tmp_path / "logs" / "dc1").mkdir(parents=True)
    (tmp_path / "dagster").mkdir()
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    instance = instance_at(tmp_path / "dagster")
    with in_process_workspace(instance, "definitions", REPO_ROOT, "photon") as context:
        sensors = remote_sensors(context)[0]
        for sensor in sensors:
            instance.start_sensor(sensor)
        for _ in range(2):
            started = time.monotonic()
            sensor_pass(context, logging.getLogger("test"), list, pace_seconds=PASS_INTERVAL_SECONDS)
            time.sleep(max(0.0, PASS_INTERVAL_SECONDS - (time.monotonic() - started)))
    ticks = {s.name: len(instance.get_ticks(s.get_remote_origin_id(), s.selector_id)) for s in sensors}
    paced = {s.name for s in sensors if s.min_interval_seconds <= PASS_INTERVAL_SECONDS}
    assert paced and len(paced) < len(sensors)
    assert ticks == {s.name: 2 if s.name in paced else 1 for s in sensors}


def test_a_runs_log_manager_reconfigures_logging_only_through_the_method_runs_on_several_threads_replaces():
    from dagster._core.instance.methods.event_methods import EventMethods

    from photon.dagster_internals import runs_on_several_threads

    source = inspect.getsource(EventMethods.get_yaml_python_handlers)
    if getattr(EventMethods.get_yaml_python_handlers, "photon_patched", False):
        source = inspect.getsource(EventMethods.get_yaml_python_handlers.__closure__[0].cell_contents)
    assert "dictConfig(" in source and "get_python_log_dagster_handler_config()" in source
    runs_on_several_threads()
    assert EventMethods.get_yaml_python_handlers.photon_patched
