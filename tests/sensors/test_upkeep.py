"""The sensors of the work kept off the click path: the aggregates refresh, the table checks and table
maintenance."""

import json
import time
from functools import partial

import dagster as dg
import deltalake
import pyarrow as pa
import pytest
from dagster._core.test_utils import create_run_for_test

from photon_assets.jobs import CHECK_TABLES_JOB, JOIN_CLICKS_JOB, REFRESH_AGGREGATES_JOB
from photon_assets.maintenance import maintenance_due
from photon_assets.work_unit import TAG_WORK_UNIT
from resources.settings import PipelineSettings
from resources.state.layout import DataLayout
from resources.state.sidecars import Removals
from sensors.deps import SensorDeps
from sensors.dispatcher import write_cursor
from sensors.upkeep import aggregates_refresher, table_checker, table_maintainer


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def evaluate(make_sensor, instance, cursor=None, **settings) -> dg.SensorResult:
    """One tick of the sensor `make_sensor(deps)` makes, with these settings (the upkeep sensors never
    ask for the registry)."""
    sensor = make_sensor(SensorDeps(PipelineSettings(**settings), registry=None))
    return sensor(dg.build_sensor_context(instance=instance, cursor=cursor))


def commit_joined(data_dir) -> int:
    """A commit to joined_clicks (written with deltalake: the sensor reads only its version)."""
    path = data_dir / "warehouse" / "joined_clicks"
    deltalake.write_deltalake(str(path), pa.table({"click_id": ["c"]}), mode="append")
    return deltalake.DeltaTable(str(path)).version()


def refreshed(instance, version: int) -> None:
    instance.report_runless_asset_event(
        dg.AssetMaterialization("click_aggregates", metadata={"joined_clicks_version": version}))


def test_the_aggregates_are_refreshed_once_per_joined_version_at_most_every_interval(tmp_path, instance):
    sensor = partial(aggregates_refresher, str(tmp_path))
    assert evaluate(sensor, instance).run_requests == []  # no joined clicks yet
    first = commit_joined(tmp_path)

    requested = evaluate(sensor, instance, aggregates_refresh_seconds=60)
    [request] = requested.run_requests
    assert request.run_key == f"aggregates.v{first}"
    # Within the interval, a newer version waits; a refresh that reached the newest has nothing to do.
    second = commit_joined(tmp_path)
    waiting = evaluate(sensor, instance, cursor=requested.cursor, aggregates_refresh_seconds=60)
    assert waiting.run_requests == [] and "next refresh in" in waiting.skip_reason.skip_message
    refreshed(instance, second)
    assert "up to date" in evaluate(sensor, instance, cursor=requested.cursor).skip_reason.skip_message

    # A refresh in flight holds the next one back, whatever the interval.
    third = commit_joined(tmp_path)
    run = create_run_for_test(instance, job_name=REFRESH_AGGREGATES_JOB, status=dg.DagsterRunStatus.STARTED)
    assert "queued or running" in evaluate(sensor, instance, aggregates_refresh_seconds=0).skip_reason.skip_message
    instance.report_run_failed(run)
    # The failed refresh of this version is tried again under a key of its own.
    stale = json.dumps({"requested_at": 0.0, "version": third, "tries": 1, "v": 1})
    [again] = evaluate(sensor, instance, cursor=stale, aggregates_refresh_seconds=0).run_requests
    assert again.run_key == f"aggregates.v{third}#2"


def test_table_maintenance_runs_every_interval_under_numbered_keys_when_it_has_work(tmp_path, instance):
    sensor = partial(table_maintainer, str(tmp_path))
    first = evaluate(sensor, instance, maintenance_every_seconds=300)
    assert first.run_requests == [] and "next maintenance in" in first.skip_reason.skip_message
    due = json.dumps({**json.loads(first.cursor), "since": time.time() - 301})
    # Nothing a run would do: no run, and the next look is a cadence later.
    idle = evaluate(sensor, instance, cursor=due, maintenance_every_seconds=300)
    assert idle.run_requests == [] and idle.skip_reason.skip_message.startswith("nothing to maintain")
    assert json.loads(idle.cursor)["since"] > time.time() - 5
    # Files a compaction removed two hours ago are due for a VACUUM.
    layout = DataLayout(tmp_path)
    removals = Removals()
    removals.add("joined_clicks", time.time() - 2 * 3600)
    removals.save(layout.removals_file)
    assert maintenance_due(layout, PipelineSettings(query_cache_vacuum_retain_hours=1), time.time()) == ["vacuum joined_clicks"]
    [request] = evaluate(sensor, instance, cursor=due, maintenance_every_seconds=300,
                         query_cache_vacuum_retain_hours=1).run_requests
    assert request.run_key == "maintenance.0"


def evaluated(instance, check: str, passed: bool) -> None:
    instance.report_runless_asset_event(dg.AssetCheckEvaluation(asset_key=dg.AssetKey("joined_clicks"),
                                                                check_name=check, passed=passed))


def test_the_aggregates_are_held_while_a_blocking_check_of_joined_clicks_has_failed(tmp_path, instance):
    sensor = partial(aggregates_refresher, str(tmp_path))
    version = commit_joined(tmp_path)
    evaluated(instance, "joined_clicks_unique", passed=False)
    held = evaluate(sensor, instance, aggregates_refresh_seconds=0)
    assert held.run_requests == []
    assert held.skip_reason.skip_message.startswith("held: joined_clicks failed joined_clicks_unique")
    # A later evaluation that passes lifts the hold.
    evaluated(instance, "joined_clicks_unique", passed=True)
    [request] = evaluate(sensor, instance, aggregates_refresh_seconds=0).run_requests
    assert request.run_key == f"aggregates.v{version}"


def test_the_table_checks_run_on_their_cadence_and_once_idle_when_the_tables_changed(tmp_path, instance):
    sensor = partial(table_checker, str(tmp_path))
    assert evaluate(sensor, instance).run_requests == []  # no table yet
    commit_joined(tmp_path)
    first = evaluate(sensor, instance, table_checks_every_seconds=300)
    [request] = first.run_requests  # idle: at once
    assert request.run_key == "checks.0"
    assert "as last checked" in evaluate(sensor, instance, cursor=first.cursor).skip_reason.skip_message

    # The tables change while a work unit is in flight: the checks wait for the cadence.
    commit_joined(tmp_path)
    run = create_run_for_test(instance, job_name=JOIN_CLICKS_JOB, status=dg.DagsterRunStatus.STARTED,
                              tags={TAG_WORK_UNIT: "dc1.click.00000001"})
    waiting = evaluate(sensor, instance, cursor=first.cursor, table_checks_every_seconds=300)
    assert waiting.run_requests == [] and "or when idle" in waiting.skip_reason.skip_message
    due = json.dumps({**json.loads(first.cursor), "requested_at": time.time() - 301})
    [request] = evaluate(sensor, instance, cursor=due, table_checks_every_seconds=300).run_requests
    assert request.run_key == "checks.1"
    # A check run in flight holds the next one back.
    create_run_for_test(instance, job_name=CHECK_TABLES_JOB, status=dg.DagsterRunStatus.STARTED)
    instance.report_run_failed(run)
    assert "queued or running" in evaluate(sensor, instance, cursor=due).skip_reason.skip_message


def test_a_run_without_a_work_unit_that_writes_the_tables_holds_the_checks_until_it_ends(tmp_path, instance):
    """Materialize in the UI: a check run created while it is in flight would evaluate the tables before its
    commit and, the newest evaluation, hide the checks of its materialization."""
    sensor = partial(table_checker, str(tmp_path))
    commit_joined(tmp_path)
    ui_run = create_run_for_test(instance, job_name="__ASSET_JOB", status=dg.DagsterRunStatus.STARTING,
                                 asset_selection={dg.AssetKey("joined_clicks")})
    checked_just_now = write_cursor({"requested_at": time.time(), "versions": [], "requested": 1})
    held = evaluate(sensor, instance, cursor=checked_just_now, table_checks_every_seconds=300)
    assert held.run_requests == [] and "or when idle" in held.skip_reason.skip_message
    # So is the sensor's first tick (a deployment just started): its cadence counts from then.
    first = evaluate(sensor, instance, table_checks_every_seconds=300)
    assert first.run_requests == [] and "or when idle" in first.skip_reason.skip_message
    instance.report_run_failed(ui_run)  # finished: the pipeline is idle
    [request] = evaluate(sensor, instance, cursor=checked_just_now, table_checks_every_seconds=300).run_requests
    assert request.run_key == "checks.1"


def test_live_logs_hold_the_checks_to_their_cadence_between_runs(tmp_path, instance):
    """Between two runs of a live pipeline no run is in flight, but its logs have lines no work unit
    holds yet: the checks wait for their cadence rather than run in every such gap."""
    sensor = partial(table_checker, str(tmp_path))
    commit_joined(tmp_path)
    clicks = tmp_path / "logs" / "dc1" / "click"
    clicks.mkdir(parents=True)
    (clicks / "clicks-0.jsonl").write_text('{"click_id": "c1"}\n')
    checked_just_now = write_cursor({"requested_at": time.time(), "versions": [], "requested": 1})
    held = evaluate(sensor, instance, cursor=checked_just_now, table_checks_every_seconds=300)
    assert held.run_requests == [] and "or when idle" in held.skip_reason.skip_message
    # Only a torn last line left (no newline yet): every complete line is cut, the pipeline is idle.
    (clicks / "clicks-0.jsonl").write_text('{"click_id": "c1"')
    [request] = evaluate(sensor, instance, cursor=checked_just_now, table_checks_every_seconds=300).run_requests
    assert request.run_key == "checks.1"


def test_upkeep_sensors_tick_four_times_a_cadence_and_at_least_every_15_s_in_both_modes(tmp_path):
    """Each tick costs SQLite writes: the upkeep sensors, whose runs come every minute or more, tick four
    times per cadence (every 15 s at most), under the daemon and under `photon run` alike."""
    settings = PipelineSettings(aggregates_refresh_seconds=60, table_checks_every_seconds=5, maintenance_every_seconds=600)
    data_dir = str(tmp_path)
    makers = (partial(aggregates_refresher, data_dir), partial(table_checker, data_dir), partial(table_maintainer, data_dir))
    for deps in (SensorDeps(settings, registry=None, ticked_by_daemon=True), SensorDeps(settings, registry=None)):
        assert [make(deps).minimum_interval_seconds for make in makers] == [15, 1, 15]
