"""The checks gating the running deployment, and `photon up`'s stop, end to end under the real `photon up`
(registry service, Spark Connect server, dagster-daemon, run server, dagster-webserver) and a browser.

On a live workload (`photon gen --follow`, clicks and queries appended for 150 s as it runs):
1. SIGTERM while a click run is under way: every process of the deployment gone within 30 s, no run
   ended as a failure (finished, or canceled by the stop).
2. A restart completes the work exactly once; meanwhile the table checks ran beside the click runs,
   and the aggregates check passed every time.
3. Another writer appends a copy of a joined row to joined_clicks: the next table checks fail
   (joined_clicks_unique), visible over /graphql and on the asset's checks tab; the webhook of
   PHOTON_ALERT_WEBHOOK receives one message naming the check (its first answer, 500, made the sender post
   it again, and the pipeline went on); click_aggregates is held (its refresher's ticks say why) and never
   reaches the duplicate's version; `photon check` exits 1 naming the check.
4. The recovery job launched over the UI's GraphQL API removes the copy; the next checks pass, the
   aggregates refresh again, and `photon check` passes.
"""

import json
import os
from contextlib import ExitStack
import signal
import subprocess
import time
from pathlib import Path

import dagster as dg
import deltalake
import pytest
from playwright.sync_api import expect

from photon.deployment import headless_instance
from photon_assets.jobs import CHECK_TABLES_JOB, JOIN_CLICKS_JOB
from photon_assets.work_unit import UNFINISHED
from resources.spark.connect_server import free_port
from resources.state.layout import REPO_ROOT, DataLayout
from sensors.upkeep import AGGREGATES_SENSOR
from tests.e2e.test_photon_run import PHOTON, photon
from tests.e2e.test_ui import CHROMIUM, graphql, ui_page
from photon.run_processes import run_process
from tests.e2e.test_up import descendants, wait_for_output, wait_until_gone
from tests.webhook import Webhook, webhook_server

pytestmark = pytest.mark.e2e

# The checks and refreshes often, so that they run beside the click runs of the live workload.
SETTINGS = {"table_checks_every_seconds": 5, "aggregates_refresh_seconds": 20}
WAIT_SECONDS = 300
GEN_RATE, GEN_SECONDS = 20, 120  # clicks per second, for this long
LOCATION = {"repositoryLocationName": "photon", "repositoryName": "__repository__"}

EXECUTIONS_QUERY = """query Executions($asset: AssetKeyInput!, $check: String!) {
  assetCheckExecutions(assetKey: $asset, checkName: $check, limit: 100) {
    runId status evaluation { success timestamp metadataEntries { label ... on IntMetadataEntry { intValue } } } } }"""
TICKS_QUERY = """query Ticks($selector: SensorSelector!) { sensorOrError(sensorSelector: $selector) {
  ... on Sensor { sensorState { ticks(limit: 20) { status skipReason } } } } }"""
LAUNCH_MUTATION = """mutation Launch($params: ExecutionParams!) { launchRun(executionParams: $params) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""
RUN_QUERY = """query Run($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"""


def start_up(data_dir: Path, log: Path, webhook: str | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    alerts = {"PHOTON_ALERT_WEBHOOK": webhook} if webhook else {}
    with open(log, "ab") as output:
        up = subprocess.Popen([*PHOTON, "up", "--data-dir", str(data_dir), "--port", str(port)], cwd=REPO_ROOT,
                              env={**os.environ, "PHOTON_SETTINGS": json.dumps(SETTINGS), **alerts},
                              stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: served(url, up, log), "the UI to serve")
    return up, url


def served(url: str, up: subprocess.Popen, log: Path) -> bool:
    assert up.poll() is None, f"photon up exited with status {up.returncode}: {log.read_text()[-3000:]}"
    try:
        return bool(graphql(url, "{ assetNodes { id } }")["assetNodes"])
    except OSError:
        return False


def wait_for(condition, what: str, seconds: float = WAIT_SECONDS):
    deadline = time.monotonic() + seconds
    while not (found := condition()):
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}"
        time.sleep(1)
    return found


def terminate(up: subprocess.Popen) -> float:
    """SIGTERM to photon up's whole process group, as a terminal's Ctrl-C or systemd sends it; asserts
    that no process of the deployment is left 30 s later. Returns how long the stop took."""
    running = descendants(up.pid)
    started = time.monotonic()
    os.killpg(up.pid, signal.SIGTERM)
    try:
        up.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(up.pid, signal.SIGKILL)
        raise
    took = time.monotonic() - started
    assert up.returncode == 0
    assert wait_until_gone(running, max(0.0, 30 - took)) == set()
    return took


def executions(url: str, check: str) -> list[dict]:
    return graphql(url, EXECUTIONS_QUERY, asset={"path": ["joined_clicks" if check != "aggregates_match_joined_clicks"
                                                          else "click_aggregates"]}, check=check)["assetCheckExecutions"]


def started_click_run(instance: dg.DagsterInstance) -> str | None:
    """A click run whose process began 2 s ago or more (past its start, into its join), if any."""
    for run in instance.get_runs(dg.RunsFilter(job_name=JOIN_CLICKS_JOB, statuses=[dg.DagsterRunStatus.STARTED])):
        process = run_process(instance, run.run_id)
        if process is not None and time.time() - process[1] > 2:
            return run.run_id
    return None


def latest_values(url: str, check: str) -> tuple[str, dict] | None:
    """The status of the check's latest execution, and its integer metadata."""
    found = executions(url, check)
    if not found or found[0]["evaluation"] is None:
        return None
    return found[0]["status"], {m["label"]: m.get("intValue") for m in found[0]["evaluation"]["metadataEntries"]}


def aggregated_through(instance: dg.DagsterInstance) -> int:
    """The joined_clicks version the latest materialization of click_aggregates reached (-1: none)."""
    event = instance.get_latest_materialization_event(dg.AssetKey("click_aggregates"))
    return -1 if event is None else event.asset_materialization.metadata["joined_clicks_version"].value


def overlapping(instance: dg.DagsterInstance, job: str, other: str) -> int:
    """Runs of `job` that ran while a run of `other` did."""
    spans = {name: [(r.start_time, r.end_time) for r in instance.get_run_records(dg.RunsFilter(job_name=name))
                    if r.start_time and r.end_time] for name in (job, other)}
    return sum(any(s < oe and os_ < e for os_, oe in spans[other]) for s, e in spans[job])


def checked_beside_a_click_run(url: str, instance: dg.DagsterInstance) -> bool:
    """Whether a check_tables run has run while a click run did; if not, launches one (over the UI's
    API) whenever a click run is queued or under way and no check run is: the table checker's own runs
    come on its cadence, and may all fall between click runs (a loaded CI machine saw six click runs and
    five check runs, none overlapping). A check run launched as a click run is queued or starts takes
    the off-click-path slot of the run queue (photon/deployment.py: instance_yaml) and runs its ~2 s beside that click run."""
    if overlapping(instance, CHECK_TABLES_JOB, JOIN_CLICKS_JOB) >= 1:
        return True
    unfinished = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
                  dg.DagsterRunStatus.STARTED]
    click_runs = instance.get_runs_count(dg.RunsFilter(job_name=JOIN_CLICKS_JOB, statuses=unfinished))
    check_runs = instance.get_runs_count(dg.RunsFilter(job_name=CHECK_TABLES_JOB, statuses=unfinished))
    if click_runs and not check_runs:
        launched = graphql(url, LAUNCH_MUTATION, params={"selector": {**LOCATION, "jobName": CHECK_TABLES_JOB},
                                                         "runConfigData": {}})["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
    return False


def test_checks_gate_the_running_deployment_and_a_stop_is_clean(tmp_path):
    with ExitStack() as held:
        checks_gate_the_running_deployment(tmp_path, held)


def checks_gate_the_running_deployment(tmp_path, held: ExitStack):
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium", pytrace=False)
    data_dir, log = tmp_path / "data", tmp_path / "up.log"
    data_dir.mkdir()
    # A live workload: clicks and queries appended as photon up runs, for a minute.
    gen = subprocess.Popen([*PHOTON, "gen", "--data-dir", str(data_dir), "--follow", "--rate", str(GEN_RATE),
                            "--duration-s", str(GEN_SECONDS), "--late-delay-s", "20", "--seed", "21",
                            "--datacenters", "dc1"], cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True)

    wait_for(lambda: (data_dir / "logs" / "dc1" / "click").is_dir(), "the generator's first files", 60)

    # 1. SIGTERM while a click run is under way.
    up, url = start_up(data_dir, log)
    instance = headless_instance(DataLayout(data_dir))  # photon up made it
    try:
        run_id = wait_for(lambda: served(url, up, log) and started_click_run(instance), "a click run under way")
    except BaseException:
        terminate(up)
        raise
    assert terminate(up) < 30
    assert instance.get_run_by_id(run_id).status in (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.CANCELED)
    assert instance.get_runs_count(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE])) == 0
    assert instance.get_runs_count(dg.RunsFilter(statuses=list(UNFINISHED))) == 0

    # 2. The restart completes the work exactly once: every check passes at idle.
    hook = held.enter_context(webhook_server(Webhook(statuses=[500])))  # refuses its first message
    up, url = start_up(data_dir, log, hook.url)
    try:
        wait_for(lambda: checked_beside_a_click_run(url, instance), "a check_tables run beside a click run",
                 GEN_SECONDS + 120)
        assert gen.wait(timeout=GEN_SECONDS + 120) == 0, gen.stderr.read()
        truth = json.loads((data_dir / "gen_summary.json").read_text())
        wait_for_output(data_dir, truth, up)
        joinable = truth["joinable_clicks"]
        wait_for(lambda: latest_values(url, "joined_clicks_unique") == (
            "SUCCEEDED", {"dagster/row_count": joinable, "distinct_click_ids": joinable, "duplicate_rows": 0}),
            "the checks of the idle pipeline")
        aggregates = executions(url, "aggregates_match_joined_clicks")
        assert aggregates and all(e["evaluation"]["success"] for e in aggregates), aggregates

        # 3. Another writer appends a copy of a joined row.
        path = str(data_dir / "warehouse" / "joined_clicks")
        deltalake.write_deltalake(path, deltalake.DeltaTable(path).to_pyarrow_table().slice(0, 1), mode="append")
        duplicated_at = deltalake.DeltaTable(path).version()
        failed = wait_for(lambda: [e for e in executions(url, "joined_clicks_unique") if e["status"] == "FAILED"],
                          "the uniqueness check to fail")[0]
        counts = {m["label"]: m.get("intValue") for m in failed["evaluation"]["metadataEntries"]}
        assert counts["duplicate_rows"] == 1
        refresher = {**LOCATION, "sensorName": AGGREGATES_SENSOR}
        wait_for(lambda: any((t["skipReason"] or "").startswith("held: joined_clicks failed joined_clicks_unique")
                             for t in graphql(url, TICKS_QUERY, selector=refresher)["sensorOrError"]["sensorState"]["ticks"]),
                 "the aggregates refresher to hold")
        assert aggregated_through(instance) < duplicated_at  # the refresh holds, or refuses (spark_ops/aggregates.py)
        [alert] = wait_for(lambda: check_alerts(hook, "joined_clicks_unique"), "the webhook's message", 120)
        assert (alert["kind"], alert["asset"], alert["run_id"]) == ("check_failed", "joined_clicks", failed["runId"])
        assert "duplicate_rows=1" in alert["text"] and alert["url"].startswith(url)
        assert hook.received[0][0] == 500 and hook.received[0][1] in hook.accepted()  # refused, then posted again
        assert served(url, up, log)  # the deployment went on
        with ui_page() as page:
            page.goto(f"{url}/assets/joined_clicks?view=checks&checkDetail=joined_clicks_unique")
            expect(page.get_by_text("Failed", exact=True).first).to_be_visible()
            row = page.get_by_role("row").filter(has=page.get_by_role("cell", name="duplicate_rows", exact=True))
            expect(row.get_by_role("cell").last).to_have_text("1")
            page.screenshot(path=tmp_path / "ui-check-failed.png")
    finally:
        if up.poll() is None:
            terminate(up)
    checked = photon("check", "--data-dir", str(data_dir))
    assert checked.returncode == 1
    assert "joined_clicks_unique" in checked.stderr, checked.stderr

    # 4. Recovery, launched over the UI's API; the next checks pass and the aggregates resume.
    up, url = start_up(data_dir, log, hook.url)
    try:
        launched = graphql(url, LAUNCH_MUTATION, params={"selector": {**LOCATION, "jobName": "recover_lost_clicks"},
                                                         "runConfigData": {}})["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        recovery = launched["run"]["runId"]
        wait_for(lambda: graphql(url, RUN_QUERY, id=recovery)["runOrError"]["status"] in ("SUCCESS", "FAILURE"),
                 "the recovery run")
        assert graphql(url, RUN_QUERY, id=recovery)["runOrError"]["status"] == "SUCCESS"
        wait_for(lambda: executions(url, "joined_clicks_unique")[0]["status"] == "SUCCEEDED", "the checks to pass")
        wait_for(lambda: aggregated_through(instance) > duplicated_at, "the aggregates to resume")
    finally:
        if up.poll() is None:
            terminate(up)
    checked = photon("check", "--data-dir", str(data_dir))
    assert checked.returncode == 0, checked.stderr
    assert len(check_alerts(hook, "joined_clicks_unique")) == 1  # one message for the one failed evaluation


def check_alerts(hook: Webhook, check: str) -> list[dict]:
    return [m for m in hook.accepted() if m["kind"] == "check_failed" and m["check"] == check]
