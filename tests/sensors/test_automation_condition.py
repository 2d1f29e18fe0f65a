"""Why click_aggregates keeps its refresher sensor (sensors/upkeep.py) rather than an AutomationCondition
(docs/ARCHITECTURE.md, "Checks that gate"), tried at dagster 1.13.27. Dagster's check conditions judge the
latest evaluation of a check only if it targets the latest materialization of its asset, while the table
checks of joined_clicks run every table_checks_every_seconds and a click run materializes it every few
seconds: gated by `all_deps_blocking_checks_passed` the refresh waits for table checks newer than the last
click run (under live logs, almost never); gated by "no blocking check failed", the next click run lifts the
gate past a duplicate. The refresher holds while the latest evaluation failed, whatever came since. And
Dagster's sensor iteration, which `photon run` calls, never ticks an automation sensor."""

import inspect

import dagster as dg
import dagster._daemon.sensor as sensor_daemon

CHECK_PASSES = {"now": True}
AC = dg.AutomationCondition
UPDATED = AC.any_deps_updated().since_last_handled() & ~AC.in_progress()
GATES = {
    "checks_passed": UPDATED & AC.all_deps_blocking_checks_passed(),
    "none_failed": UPDATED & AC.all_deps_match(~AC.any_checks_match(AC.check_failed(), blocking_only=True)),
}


@dg.asset(name="joined_clicks")
def joined():
    return 1


@dg.asset_check(asset="joined_clicks", name="joined_clicks_unique", blocking=True)
def unique() -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=CHECK_PASSES["now"])


def aggregates(gate: str) -> dg.AssetsDefinition:
    @dg.asset(name="click_aggregates", deps=["joined_clicks"], automation_condition=GATES[gate])
    def _aggregates():
        return 1

    return _aggregates


def refreshes_after_a_click_run(gate: str, table_checks_pass: bool) -> bool:
    """Table checks evaluate joined_clicks, then a click run materializes it (its own checks are others):
    whether the gate would refresh click_aggregates now."""
    assets = [joined, unique, aggregates(gate)]
    with dg.instance_for_test() as instance:
        CHECK_PASSES["now"] = table_checks_pass
        dg.materialize([joined, unique], instance=instance, raise_on_error=False)
        first = dg.evaluate_automation_conditions(assets, instance=instance)
        dg.materialize([joined], instance=instance, selection=[joined.key])  # a click run
        after = dg.evaluate_automation_conditions(assets, instance=instance, cursor=first.cursor)
        return after.get_num_requested(dg.AssetKey("click_aggregates")) == 1


def refreshes_after_the_checks(gate: str, table_checks_pass: bool) -> bool:
    """The control: the checks evaluate the latest materialization, and each gate does what it says."""
    assets = [joined, unique, aggregates(gate)]
    with dg.instance_for_test() as instance:
        CHECK_PASSES["now"] = table_checks_pass
        first = dg.evaluate_automation_conditions(assets, instance=instance)
        dg.materialize([joined, unique], instance=instance, raise_on_error=False)
        after = dg.evaluate_automation_conditions(assets, instance=instance, cursor=first.cursor)
        return after.get_num_requested(dg.AssetKey("click_aggregates")) == 1


def test_dagsters_check_gates_starve_the_refresh_or_forget_a_failed_check():
    for gate in GATES:
        assert refreshes_after_the_checks(gate, table_checks_pass=True)
        assert not refreshes_after_the_checks(gate, table_checks_pass=False)
    # Every check passed: still no refresh after the click run (its table checks have not run yet).
    assert not refreshes_after_a_click_run("checks_passed", table_checks_pass=True)
    # The uniqueness check failed: the next click run lifts this gate (the refresher would hold).
    assert refreshes_after_a_click_run("none_failed", table_checks_pass=False)


def test_photon_runs_sensor_iteration_skips_automation_sensors():
    """`photon run` ticks sensors through the sensor daemon's iteration (photon/dagster_internals.py): an
    AutomationConditionSensorDefinition is the asset daemon's, and this iteration never ticks it."""
    assert "is_handled_by_asset_daemon" in inspect.getsource(sensor_daemon.execute_sensor_iteration)
