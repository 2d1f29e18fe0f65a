"""Sensors for the work kept off the click path: refreshing click_aggregates, checking the tables and
maintaining them.

Each requests a run at most every so often (PipelineSettings: aggregates_refresh_seconds,
table_checks_every_seconds, maintenance_every_seconds), never while one of its runs is queued or
running. The aggregates refresh runs only when `joined_clicks` has a version its last refresh did not
reach, and never while a blocking check of joined_clicks has failed at its latest evaluation (the
checks gate what is built on it); its run key names that version (and a try number, should a run for it
fail). The table checks run when the tables changed since the last ones: on their cadence, and at once
when the pipeline is idle (`tables_busy`: no run in flight and every log line cut). Maintenance runs on
its cadence when a run would do something (photon_assets/maintenance.py: `maintenance_due`). Check and
maintenance runs are numbered.
"""

from __future__ import annotations

import time
from pathlib import Path

import dagster as dg

from photon_assets.checks import failed_blocking_checks
from photon_assets.jobs import CHECK_TABLES_JOB, REFRESH_AGGREGATES_JOB
from photon_assets.maintenance import MAINTENANCE_JOB, maintenance_due
from photon_assets.work_unit import UNFINISHED, bytes_behind_log_heads, work_units_awaiting_retry
from resources.state.layout import STREAMS, DataLayout
from sensors.deps import SensorDeps, sensor_instance
from sensors.dispatcher import MIN_INTERVAL_SECONDS, default_status, read_cursor, run_loggers, write_cursor
from spark_ops.tables import latest_version, table_committed
from spark_ops.verification import committed_version

AGGREGATES_SENSOR = "click_aggregates_refresher"
CHECKS_SENSOR = "table_checker"
CHECKED_TABLES = ("joined_clicks", "unjoinable_clicks", "pending_clicks", "click_aggregates")
MAINTENANCE_SENSOR = "table_maintenance"


# Every tick of a sensor costs SQLite writes (the tick, its state, the purge of old ticks): an idle
# `photon up` took 15.9 % of a core, 10 % of it the daemon, mostly its sensor ticks (py-spy,
# 2026-11-28), and under `photon run` the ticks of the upkeep sensors in every pass held the GIL its click
# runs need. These sensors' runs come every minute or more.
UPKEEP_TICKS_PER_CADENCE = 4
UPKEEP_MAX_TICK_SECONDS = 15


def upkeep_interval(cadence_seconds: float) -> int:
    """How often an upkeep sensor ticks: four times per cadence and at least once every 15 s (a run then
    comes at most a quarter of its cadence late), under the daemon and under `photon run` alike (its
    idleness is its click passes', photon/runner.py: _drain; these sensors tick on a thread of their own)."""
    return max(MIN_INTERVAL_SECONDS, int(min(UPKEEP_MAX_TICK_SECONDS, cadence_seconds / UPKEEP_TICKS_PER_CADENCE)))


def runs_in_flight(instance: dg.DagsterInstance, job_name: str) -> int:
    return instance.get_runs_count(dg.RunsFilter(job_name=job_name, statuses=list(UNFINISHED)))


def unfinished_runs(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    return instance.get_runs(dg.RunsFilter(statuses=list(UNFINISHED)))


def tables_busy(instance: dg.DagsterInstance, layout: DataLayout, unfinished: list[dg.DagsterRun]) -> bool:
    """Whether a run that may still change the checked tables is queued or running (among `unfinished`,
    the instance's queued and running runs, which the caller has read for its own test), a work unit awaits
    its retry, or a log has complete lines no work unit holds yet. Every run but a check run counts, not
    only the work units': a Materialize from the UI, a refresh, maintenance. A check run created while
    one of them is in flight evaluates the tables before its commit, and being the newest evaluation, it
    hides the checks of the latest materialization. The uncut lines make live logs busy between two
    runs: checking in every such gap took a run every 25-50 s beside the click runs (a live `photon up`
    of 2026-11-27), not every table_checks_every_seconds."""
    if any(run.job_name != CHECK_TABLES_JOB for run in unfinished) or work_units_awaiting_retry(instance):
        return True
    return any(bytes_behind_log_heads(layout, dc, stream) for dc in layout.datacenters() for stream in STREAMS)


def refreshed_version(instance: dg.DagsterInstance) -> int:
    """The joined_clicks version the latest refresh of click_aggregates reached (-1: none yet)."""
    event = instance.get_latest_materialization_event(dg.AssetKey("click_aggregates"))
    value = event.asset_materialization.metadata.get("joined_clicks_version") if event else None
    return -1 if value is None else int(value.value)


def aggregates_refresher(data_dir: str, deps: SensorDeps) -> dg.SensorDefinition:
    @dg.sensor(
        name=AGGREGATES_SENSOR,
        job_name=REFRESH_AGGREGATES_JOB,
        minimum_interval_seconds=upkeep_interval(deps.settings.aggregates_refresh_seconds),
        default_status=default_status(),
        description="Refreshes click_aggregates with the rows joined since its last refresh, at most every "
        "aggregates_refresh_seconds (off the click path: a pass does not wait for it).",
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        cursor = read_cursor(context.cursor, requested_at=0.0, version=-1, tries=0)
        instance = sensor_instance(context)
        joined = DataLayout(Path(data_dir)).table("joined_clicks")
        if not table_committed(joined):
            return dg.SensorResult(cursor=write_cursor(cursor), skip_reason="no joined clicks yet")
        version = latest_version(joined)
        if refreshed_version(instance) >= version:
            return dg.SensorResult(cursor=write_cursor(cursor), skip_reason=f"up to date with joined_clicks version {version}")
        if runs_in_flight(instance, REFRESH_AGGREGATES_JOB):
            return dg.SensorResult(cursor=write_cursor(cursor), skip_reason="a refresh is queued or running")
        failed = failed_blocking_checks(instance)
        if failed:
            return dg.SensorResult(cursor=write_cursor(cursor), skip_reason=(
                f"held: joined_clicks failed {', '.join(failed)}; the aggregates resume once its checks pass"))
        wait = cursor["requested_at"] + deps.settings.aggregates_refresh_seconds - time.time()
        if wait > 0:
            return dg.SensorResult(cursor=write_cursor(cursor), skip_reason=f"next refresh in {wait:.0f} s")
        tries = cursor["tries"] + 1 if cursor["version"] == version else 1
        key = f"aggregates.v{version}" + (f"#{tries}" if tries > 1 else "")
        return dg.SensorResult(
            run_requests=[dg.RunRequest(run_key=key, run_config=run_loggers(), tags={"photon/kind": "aggregates"})],
            cursor=write_cursor({"requested_at": time.time(), "version": version, "tries": tries}),
        )

    return _sensor


def table_versions(data_dir: str) -> list[int]:
    layout = DataLayout(Path(data_dir))
    return [committed_version(str(layout.table(name))) for name in CHECKED_TABLES]


def table_checker(data_dir: str, deps: SensorDeps) -> dg.SensorDefinition:
    @dg.sensor(
        name=CHECKS_SENSOR,
        job_name=CHECK_TABLES_JOB,
        minimum_interval_seconds=upkeep_interval(deps.settings.table_checks_every_seconds),
        default_status=default_status(),
        description="Runs every whole-table check when the output tables changed since the last ones: at most "
        "every table_checks_every_seconds, and at once when idle: no other run in flight, every log line cut.",
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        # A first tick counts the cadence from now: checks due at once would start beside whatever
        # the deployment's first runs are (a Materialize from the UI) rather than when it is idle.
        cursor = read_cursor(context.cursor, requested_at=time.time(), versions=[], requested=0)
        versions = table_versions(data_dir)
        if versions == cursor["versions"] or max(versions) < 0:
            return dg.SensorResult(cursor=write_cursor(cursor), skip_reason="the tables are as last checked")
        instance = sensor_instance(context)
        unfinished = unfinished_runs(instance)
        if any(run.job_name == CHECK_TABLES_JOB for run in unfinished):
            return dg.SensorResult(cursor=write_cursor(cursor), skip_reason="a check run is queued or running")
        wait = cursor["requested_at"] + deps.settings.table_checks_every_seconds - time.time()
        if wait > 0 and tables_busy(instance, DataLayout(Path(data_dir)), unfinished):
            return dg.SensorResult(cursor=write_cursor(cursor), skip_reason=f"next checks in {wait:.0f} s, or when idle")
        return dg.SensorResult(
            run_requests=[dg.RunRequest(run_key=f"checks.{cursor['requested']}", run_config=run_loggers(),
                                        tags={"photon/kind": "checks"})],
            cursor=write_cursor({"requested_at": time.time(), "versions": versions, "requested": cursor["requested"] + 1}),
        )

    return _sensor


def table_maintainer(data_dir: str, deps: SensorDeps) -> dg.SensorDefinition:
    @dg.sensor(
        name=MAINTENANCE_SENSOR,
        job_name=MAINTENANCE_JOB,
        minimum_interval_seconds=upkeep_interval(deps.settings.maintenance_every_seconds),
        default_status=default_status(),
        description="Maintains the tables every maintenance_every_seconds when a run would do something "
        "(photon_assets/maintenance.py): durable tier eviction, pending-click records compacted, small files "
        "compacted and vacuumed.",
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        now = time.time()
        cursor = read_cursor(context.cursor, since=now, requested=0)
        if runs_in_flight(sensor_instance(context), MAINTENANCE_JOB):
            return dg.SensorResult(cursor=write_cursor(cursor), skip_reason="maintenance is queued or running")
        wait = cursor["since"] + deps.settings.maintenance_every_seconds - now
        if wait > 0:
            return dg.SensorResult(cursor=write_cursor(cursor), skip_reason=f"next maintenance in {wait:.0f} s")
        # An idle deployment launched a run every cadence that did nothing (a run's launch, its process and
        # its events: CPU an idle `photon up` should not spend). Looked at once a cadence.
        if not maintenance_due(DataLayout(Path(data_dir)), deps.settings, now):
            return dg.SensorResult(cursor=write_cursor({**cursor, "since": now}),
                                   skip_reason="nothing to maintain: no table to compact, no query to evict, no file to vacuum")
        return dg.SensorResult(
            run_requests=[dg.RunRequest(run_key=f"maintenance.{cursor['requested']}", run_config=run_loggers(),
                                        tags={"photon/kind": "maintenance"})],
            cursor=write_cursor({"since": now, "requested": cursor["requested"] + 1}),
        )

    return _sensor
