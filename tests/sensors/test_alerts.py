"""The alert sensor over a real instance: a failed blocking check's evaluation and a work unit's last attempt
failing each become one message in the outbox, named by the event; a passing or non-blocking check, an attempt
that will be retried and the events before the sensor's first tick do not."""

import json

import dagster as dg

from resources.settings import PipelineSettings
from resources.state.alert_outbox import AlertOutbox
from sensors.alerts import WEBHOOK_ENV, alert_sensor
from sensors.deps import SensorDeps


@dg.asset
def table():
    return 1


@dg.asset_check(asset=table, blocking=True)
def no_duplicates() -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=False, metadata={"duplicate_rows": 1})


@dg.asset_check(asset=table)
def advisory() -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=False)


@dg.asset
def failing():
    raise RuntimeError("boom")


def tick(sensor, instance, cursor):
    result = sensor(dg.build_sensor_context(instance=instance, cursor=cursor))
    return result.cursor


def queued(tmp_path) -> list[dict]:
    return [json.loads(p.read_text())["message"] for p in sorted((tmp_path / "state" / "alerts" / "outbox").glob("*"))]


def test_failed_blocking_checks_and_work_units_failed_for_good_are_queued_once(tmp_path, monkeypatch):
    monkeypatch.setenv(WEBHOOK_ENV, "http://127.0.0.1:1/hook")
    monkeypatch.setenv("PHOTON_UI_URL", "http://127.0.0.1:3000")
    settings = PipelineSettings(max_attempts=3)
    sensor = alert_sensor(str(tmp_path), SensorDeps(settings, lambda: None))
    with dg.instance_for_test() as instance:
        dg.materialize([table, no_duplicates], instance=instance, raise_on_error=False)  # before the first tick
        cursor = tick(sensor, instance, None)
        assert queued(tmp_path) == []
        failed = dg.materialize([table, no_duplicates, advisory], instance=instance, raise_on_error=False)
        dg.materialize([table, no_duplicates], instance=instance, raise_on_error=False)  # still failing: no news
        for attempt in (1, 3):  # the first is retried; the third is the last
            dg.materialize([failing], instance=instance, raise_on_error=False,
                           tags={"photon/work_unit": "dc1.click.00000004", "photon/attempt": str(attempt)})
        cursor = tick(sensor, instance, cursor)
        assert tick(sensor, instance, cursor) == cursor
        messages = queued(tmp_path)
        assert tick(sensor, instance, None) and queued(tmp_path) == messages  # a restarted cursor: from now on
    by_kind = {m["kind"]: m for m in messages}
    assert len(messages) == 2 and set(by_kind) == {"check_failed", "work_unit_failed"}
    check = by_kind["check_failed"]
    assert (check["asset"], check["check"], check["run_id"]) == ("table", "no_duplicates", failed.run_id)
    assert "duplicate_rows=1" in check["text"]
    assert check["url"] == "http://127.0.0.1:3000/assets/table?view=checks&checkDetail=no_duplicates"
    assert "dc1.click.00000004" in by_kind["work_unit_failed"]["text"]
    assert set(check) == {"text", "kind", "asset", "check", "run_id", "url"}
    assert AlertOutbox(tmp_path / "state" / "alerts").put("check_failed:1", check)  # another event: its own message


def test_a_check_failing_again_after_it_passed_is_reported_again(tmp_path, monkeypatch):
    monkeypatch.setenv(WEBHOOK_ENV, "http://127.0.0.1:1/hook")
    sensor = alert_sensor(str(tmp_path), SensorDeps(PipelineSettings(), lambda: None))
    with dg.instance_for_test() as instance:
        cursor = tick(sensor, instance, None)
        for passes in (False, True, False):
            PASSES["now"] = passes
            dg.materialize([table, flaky], instance=instance, raise_on_error=False)
            cursor = tick(sensor, instance, cursor)
    assert [m["check"] for m in queued(tmp_path)] == ["flaky", "flaky"]
    assert json.loads(cursor)["failing"] == ["table/flaky"]


PASSES = {"now": False}


@dg.asset_check(asset=table, blocking=True)
def flaky() -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=PASSES["now"])
