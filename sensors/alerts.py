"""The alert sensor: under `photon up`, each of these events becomes one JSON message for the webhook named
by PHOTON_ALERT_WEBHOOK (keys `text`, `kind`, `asset`, `check`, `run_id`, `url`; Slack's incoming webhooks
show `text`), put in the data directory's durable outbox (resources/state/alert_outbox.py) and posted by
`photon up`'s sender off this sensor's thread (photon/alert_sender.py):

- `check_failed`: an ASSET_CHECK_EVALUATION of a blocking check that did not pass (a check run may
  succeed while its check fails: the evaluation says, not the run), when the check starts failing: its
  later failed evaluations add nothing until one passes;
- `work_unit_failed`: a work unit failed for good, its last attempt (max_attempts) ended early: one
  message per unit, not per attempt (photon_assets/work_unit.py, sensors/retries.py);
- `stale`: a FRESHNESS_STATE_CHANGE to FAIL, by Dagster's freshness daemon (photon_assets/freshness.py).

It reads the instance's event log after the storage ids its cursor holds (versioned JSON: one id per kind
of event, and the checks failing): the runs that ended, each one's check evaluations, and the freshness
changes. It names each message by the event's identity (run and check; a work unit's id; a freshness
change's storage id), so a tick run again puts nothing twice. (The SQLite event log answers a query by
event type from its index only for asset events and run status changes: check evaluations are read per
ended run.) Its first tick starts from the newest events: it reports what happens while it runs. Without
PHOTON_ALERT_WEBHOOK it only moves its cursor. `photon run` does not tick it: its summary and exit status
say the same things.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import dagster as dg

from photon_assets.work_unit import TAG_ATTEMPT, TAG_WORK_UNIT
from resources.state.alert_outbox import AlertOutbox
from resources.state.layout import DataLayout
from sensors.deps import SensorDeps, sensor_instance
from sensors.dispatcher import default_status, read_cursor, write_cursor

ALERTS_SENSOR = "photon_alerts"
WEBHOOK_ENV = "PHOTON_ALERT_WEBHOOK"
UI_URL_ENV = "PHOTON_UI_URL"  # set by `photon up`: the webserver's address, for the messages' links
# As often as the upkeep sensors at most (sensors/upkeep.py: UPKEEP_MAX_TICK_SECONDS): each tick of an idle
# deployment costs CPU (docs/STACK.md); an alert comes at most 15 s after its event.
ALERT_TICK_SECONDS = 15
BATCH = 100  # events read per kind and tick
# Run ends, read from the event log's index (`fetch_run_status_changes`): each ended run's check evaluations,
# and a work unit's last attempt ending early. Freshness changes are asset events of that index too.
RUN_ENDS = {"successes": dg.DagsterEventType.RUN_SUCCESS, "failures": dg.DagsterEventType.RUN_FAILURE,
            "cancels": dg.DagsterEventType.RUN_CANCELED}
FRESHNESS = "freshness"
KINDS = (*RUN_ENDS, FRESHNESS)


def message(kind: str, text: str, asset: str | None = None, check: str | None = None, run_id: str | None = None,
            url: str | None = None) -> dict:
    return {"text": text, "kind": kind, "asset": asset, "check": check, "run_id": run_id, "url": url}


def ui_link(path: str) -> str | None:
    base = os.environ.get(UI_URL_ENV)
    return f"{base.rstrip('/')}{path}" if base else None


def check_alerts(instance: dg.DagsterInstance, run_id: str, failing: set[str]) -> list[tuple[str, dict]]:
    """The run's ASSET_CHECK_EVALUATION events of blocking checks that did not pass (a check run succeeds
    whether its checks pass or not; a click run fails with them), each when its check starts failing: not
    again while later evaluations fail too (the table checks every few minutes, `photon check`), again once
    one passed. `failing` (the cursor's) holds the checks whose latest evaluation read failed."""
    alerts = []
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION):
        evaluation = entry.dagster_event.asset_check_evaluation_data
        asset, check = evaluation.asset_key.to_user_string(), evaluation.check_name
        if evaluation.passed or not evaluation.blocking:
            failing.discard(f"{asset}/{check}")
            continue
        if f"{asset}/{check}" in failing:
            continue
        failing.add(f"{asset}/{check}")
        counts = ", ".join(f"{k}={v.value}" for k, v in evaluation.metadata.items()
                           if isinstance(v.value, (int, float)) and not isinstance(v.value, bool))
        alerts.append((f"check_failed:{run_id}:{asset}:{check}", message(
            "check_failed", f"photon: blocking check {check} of {asset} failed" + (f" ({counts})" if counts else ""),
            asset, check, run_id, ui_link(f"/assets/{asset}?view=checks&checkDetail={check}"))))
    return alerts


def work_unit_alert(instance: dg.DagsterInstance, run_id: str, max_attempts: int) -> list[tuple[str, dict]]:
    """A work unit whose last attempt (max_attempts) ended early: failed for good, one message per unit."""
    run = instance.get_run_by_id(run_id)
    if run is None or TAG_WORK_UNIT not in run.tags or int(run.tags.get(TAG_ATTEMPT, "1")) < max_attempts:
        return []
    unit = run.tags[TAG_WORK_UNIT]
    return [(f"work_unit_failed:{unit}", message(
        "work_unit_failed", f"photon: work unit {unit} failed for good after {max_attempts} attempts; "
        "its clicks wait for recover_lost_clicks", run_id=run_id, url=ui_link(f"/runs/{run_id}")))]


def stale_alert(record: dg.EventLogRecord) -> list[tuple[str, dict]]:
    change = record.event_log_entry.dagster_event.asset_freshness_state_change_data
    if change.new_state.value != "FAIL":
        return []
    asset = change.key.to_user_string()
    return [(f"stale:{record.storage_id}", message(
        "stale", f"photon: {asset} is stale: not materialized within its freshness policy's fail window",
        asset, url=ui_link(f"/assets/{asset}")))]


def events_after(instance: dg.DagsterInstance, kind: str, after: int | None, limit: int = BATCH) -> list[dg.EventLogRecord]:
    """The events of a kind after a storage id, oldest first; with none, the newest event alone."""
    ascending = after is not None
    if kind in RUN_ENDS:
        return list(instance.fetch_run_status_changes(
            dg.RunStatusChangeRecordsFilter(RUN_ENDS[kind], after_storage_id=after), limit=limit if ascending else 1,
            ascending=ascending).records)
    with warnings.catch_warnings():  # deprecated for 2.0; no fetch_ method reads these events yet
        warnings.simplefilter("ignore")
        return list(instance.get_event_records(dg.EventRecordsFilter(dg.DagsterEventType.FRESHNESS_STATE_CHANGE,
                                                                     after_cursor=after),
                                               limit=limit if ascending else 1, ascending=ascending))


def new_alerts(instance: dg.DagsterInstance, cursor: dict, max_attempts: int) -> list[tuple[str, dict]]:
    """The alerts of the events after the cursor's storage ids, which it moves past them; a kind with no
    storage id yet (a first tick) starts from its newest event. Runs in the order they ended."""
    alerts, failing, ended = [], set(cursor.get("failing", [])), []
    for kind in KINDS:
        records = events_after(instance, kind, cursor.get(kind))
        if cursor.get(kind) is None:
            cursor[kind] = records[0].storage_id if records else 0
            continue
        cursor[kind] = max([cursor[kind], *(record.storage_id for record in records)])
        if kind == FRESHNESS:
            alerts += [alert for record in records for alert in stale_alert(record)]
        else:
            ended += [(record.storage_id, kind, record.event_log_entry.run_id) for record in records]
    for _, kind, run_id in sorted(ended):
        alerts += check_alerts(instance, run_id, failing)
        if kind != "successes":
            alerts += work_unit_alert(instance, run_id, max_attempts)
    cursor["failing"] = sorted(failing)
    return alerts


def alert_sensor(data_dir: str, deps: SensorDeps) -> dg.SensorDefinition:
    outbox = AlertOutbox(DataLayout(Path(data_dir)).alerts_dir)

    @dg.sensor(
        name=ALERTS_SENSOR,
        minimum_interval_seconds=ALERT_TICK_SECONDS,
        default_status=default_status(),
        description="Puts a message for the webhook of PHOTON_ALERT_WEBHOOK in the outbox for each failed blocking "
        "check, work unit failed for good and asset turned stale; photon up posts them.",
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        cursor = read_cursor(context.cursor, **{kind: None for kind in KINDS})
        alerts = new_alerts(sensor_instance(context), cursor, deps.settings.max_attempts)
        webhook = bool(os.environ.get(WEBHOOK_ENV))
        queued = sum(outbox.put(key, body) for key, body in alerts) if webhook else 0
        reason = (f"{queued} alert(s) queued" if queued else "no new alert") if webhook else f"{WEBHOOK_ENV} not set"
        return dg.SensorResult(cursor=write_cursor(cursor), skip_reason=reason)

    return _sensor
