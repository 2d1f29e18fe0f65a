"""The Dagster UI of the real deployment (`photon up`), driven in a browser (Playwright, Debian's
chromium): on a processed workload, the asset graph draws every asset of both groups; Materialize on
joined_clicks, with no config typed (a catch-up run of dc1's click lines not yet in a work unit), runs
through the daemon and succeeds, with joined_clicks' checks in the same run; the checks tab shows each check passed with
the counts the GraphQL API reports; the asset's metadata plots render. Screenshots go to the test's
tmp dir (and to docs/ on demand: `screenshot`). Everything is stopped at the end, leaving no process."""

import json
import os
from contextlib import contextmanager
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import dagster as dg
import pytest
from playwright.sync_api import Page, expect, sync_playwright

from photon_assets.checks import ALL_CHECKS, WORK_UNIT_CHECK_SPECS
from photon_assets.jobs import CHECK_TABLES_JOB
from resources.spark.connect_server import free_port
from resources.spark.session import SPARK_REMOTE_ENV
from resources.state.layout import REPO_ROOT, TABLES
from tests.e2e.test_photon_run import PHOTON, photon, run
from tests.e2e.test_up import descendants, wait_until_gone

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")  # Playwright's own browser download is not reachable here
DOCS = REPO_ROOT / "docs"
UI_TIMEOUT_MS = 60_000  # a page on 2 busy cores, the code location loading, a run's events arriving
START_SECONDS = 300
RUN_SECONDS = 600  # a UI run: a process per step, each a Spark Connect client (20-110 s seen)
ASSET_GROUPS = {
    "query_logs": "event_store", "log_file_map": "event_store", "quarantined_lines": "event_store",
    "click_ledger": "joiner", "joined_clicks": "joiner", "unjoinable_clicks": "joiner",
    "pending_clicks": "joiner", "click_aggregates": "joiner",
}
JOINED_CLICKS_CHECKS = sorted(
    [c.check_key.name for c in ALL_CHECKS if c.check_key.asset_key == dg.AssetKey("joined_clicks")]
    + [spec.name for spec in WORK_UNIT_CHECK_SPECS]  # the click run's own, in its op
)

ASSETS_QUERY = "{ assetNodes { assetKey { path } groupName } }"
UI_RUNS_QUERY = """{ runsOrError(filter: {tags: [{key: "dagster/from_ui", value: "true"}]}) {
  ... on Runs { results { runId status } } } }"""
UNFINISHED_RUNS_QUERY = """{ runsOrError(filter: {statuses: [QUEUED, NOT_STARTED, STARTING, STARTED]}) {
  ... on Runs { results { runId } } } }"""
CHECKS_QUERY = """query Checks($path: [String!]!) { assetNodes(assetKeys: [{path: $path}]) {
  assetChecksOrError { ... on AssetChecks { checks { name executionForLatestMaterialization {
    runId status evaluation { success metadataEntries { label ... on IntMetadataEntry { intValue } } } } } } } } }"""
RUN_JOB_QUERY = """query Run($runId: ID!) { runOrError(runId: $runId) { ... on Run { jobName } } }"""


def graphql(url: str, query: str, **variables) -> dict:
    request = urllib.request.Request(f"{url}/graphql", data=json.dumps({"query": query, "variables": variables}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        body = json.load(answer)
    assert "errors" not in body, body["errors"]
    return body["data"]


def start_up(data_dir: Path, log: Path) -> tuple[subprocess.Popen, str]:
    """`photon up` in a process group of its own, and its UI's address once the webserver serves and
    has loaded the code location (its assets answer over GraphQL)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log, "ab") as output:
        up = subprocess.Popen([*PHOTON, "up", "--data-dir", str(data_dir), "--port", str(port)], cwd=REPO_ROOT,
                              stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + START_SECONDS
    while True:
        assert up.poll() is None, f"photon up exited with status {up.returncode}: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"the UI did not serve in {START_SECONDS} s: {log.read_text()[-3000:]}"
        try:
            if graphql(url, ASSETS_QUERY)["assetNodes"]:
                return up, url
        except OSError:
            pass  # not listening yet
        time.sleep(0.5)


def stop_up(up: subprocess.Popen) -> set[int]:
    """SIGTERM to photon up, which stops its components (each a process group of its own) and their
    runs; SIGKILL to what is left after 30 s. Returns the processes that outlived it (killed too)."""
    running = descendants(up.pid)
    up.send_signal(signal.SIGTERM)
    try:
        up.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(up.pid, signal.SIGKILL)
        up.wait()
    left = wait_until_gone(running, 10)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def polled(up: subprocess.Popen, probe, what: str):
    """`probe()`'s first answer that is not None, asked every second while `photon up` runs, within
    RUN_SECONDS (`what` names the state waited for)."""
    deadline = time.monotonic() + RUN_SECONDS
    while (answer := probe()) is None:
        assert up.poll() is None, f"photon up exited with status {up.returncode}"
        assert time.monotonic() < deadline, f"not {what} after {RUN_SECONDS} s"
        time.sleep(1)
    return answer


def settled(url: str, up: subprocess.Popen) -> None:
    """Until no run is queued or running: the deployment's own first runs (a table check on what
    `photon run` committed) start before the UI's, and its checks are the
    latest evaluations of joined_clicks' latest materialization."""
    polled(up, lambda: True if not graphql(url, UNFINISHED_RUNS_QUERY)["runsOrError"]["results"] else None,
           "settled (runs still in flight)")


def evaluated_checks(url: str, up: subprocess.Popen) -> dict:
    """joined_clicks' checks and their executions for its latest materialization, once none is in
    progress: the table checker evaluates the whole-table ones again as soon as the deployment is
    idle after the UI's run, so the latest may be its run's."""
    def checks() -> dict | None:
        asset = graphql(url, CHECKS_QUERY, path=["joined_clicks"])["assetNodes"][0]
        found = {c["name"]: c["executionForLatestMaterialization"] for c in asset["assetChecksOrError"]["checks"]}
        done = all(execution and execution["status"] != "IN_PROGRESS" for execution in found.values())
        return found if done else None

    return polled(up, checks, "every check of joined_clicks evaluated for its latest materialization")


def ui_run(url: str, up: subprocess.Popen) -> dict:
    """The run launched from the UI, once it has finished."""
    def finished() -> dict | None:
        runs = graphql(url, UI_RUNS_QUERY)["runsOrError"]["results"]
        assert len(runs) <= 1, runs
        return runs[0] if runs and runs[0]["status"] in ("SUCCESS", "FAILURE", "CANCELED") else None

    return polled(up, finished, "finished (the UI's run)")


@contextmanager
def ui_page():
    """A page of Debian's chromium (Playwright), with the UI's timeouts."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        page = browser.new_page(viewport={"width": 1600, "height": 1100})
        page.set_default_timeout(UI_TIMEOUT_MS)
        expect.set_options(timeout=UI_TIMEOUT_MS)
        yield page
        browser.close()


def screenshot(page: Page, name: str, tmp_path: Path) -> None:
    """Into the test's tmp dir; into docs/ too with PHOTON_UI_SCREENSHOTS=docs (how docs/ui-*.png are made)."""
    page.screenshot(path=tmp_path / name)
    if os.environ.get("PHOTON_UI_SCREENSHOTS") == "docs":
        page.screenshot(path=DOCS / name)


def test_the_ui_draws_materializes_and_checks_joined_clicks(tmp_path, spark_connect_server):
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium", pytrace=False)
    assert set(ASSET_GROUPS) == set(TABLES)  # every table is an asset
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    result = photon("gen", "--data-dir", str(data_dir), "--queries", "300", "--seed", "7", "--datacenters", "dc1")
    assert result.returncode == 0, result.stderr
    truth = json.loads((data_dir / "gen_summary.json").read_text())
    summary = run(data_dir, env_extra={SPARK_REMOTE_ENV: spark_connect_server})
    assert summary["clicks_joined"] == truth["joinable_clicks"] and summary["clicks_pending"] == 0

    up, url = start_up(data_dir, tmp_path / "up.log")
    try:
        assets = graphql(url, ASSETS_QUERY)["assetNodes"]
        assert {"/".join(a["assetKey"]["path"]): a["groupName"] for a in assets} == ASSET_GROUPS
        with ui_page() as page:

            # 1. The global asset graph, every group expanded: each asset drawn, materialized by photon run.
            page.goto(f"{url}/asset-groups")
            page.get_by_role("button", name="settings", exact=True).click()
            page.get_by_role("menuitem", name="Expand all groups").click()
            page.reload()  # the expanded groups are remembered; a fresh load fits them in view
            for name in ASSET_GROUPS:
                expect(page.get_by_text(name, exact=True)).to_be_visible()
            expect(page.get_by_text("Materialized", exact=True)).to_have_count(len(ASSET_GROUPS))
            screenshot(page, "ui-asset-graph.png", tmp_path)

            # 2. Materialize joined_clicks, no config typed: the pass writes and records its multi-asset's
            # siblings too (join_clicks is subsettable: no "additional assets" dialog), and the run catches
            # up on dc1's click lines (photon run left none: its tables as they are).
            page.goto(f"{url}/assets/joined_clicks")
            settled(url, up)
            page.get_by_role("button", name="Materialize").click()
            launched = ui_run(url, up)
            assert launched["status"] == "SUCCESS", (launched, (data_dir / "state" / "up" / "dagster-daemon.log").read_text()[-3000:])
            page.goto(f"{url}/runs/{launched['runId']}")
            expect(page.get_by_text("Success", exact=True)).to_be_visible()
            expect(page.get_by_text(f"{len(JOINED_CLICKS_CHECKS)} checks", exact=True)).to_be_visible()

            # 3. The checks ran in that run, each passed; the checks tab shows it and their counts.
            checks = evaluated_checks(url, up)
            assert sorted(checks) == JOINED_CLICKS_CHECKS
            for name, execution in checks.items():
                assert execution and execution["status"] == "SUCCEEDED" and execution["evaluation"]["success"], (name, checks)
            # They ran in the UI's run (its page counts them), the whole-table ones perhaps again since.
            for definition in ALL_CHECKS:
                run_id = checks.get(definition.check_key.name, {}).get("runId")
                if run_id and run_id != launched["runId"]:
                    job = graphql(url, RUN_JOB_QUERY, runId=run_id)["runOrError"]["jobName"]
                    assert job == CHECK_TABLES_JOB, (definition.check_key.name, job, checks)
            counts = {name: {e["label"]: e["intValue"] for e in execution["evaluation"]["metadataEntries"] if "intValue" in e}
                      for name, execution in checks.items()}
            unique = counts["joined_clicks_unique"]
            assert unique["duplicate_rows"] == 0 and unique["distinct_click_ids"] == truth["joinable_clicks"], unique

            page.goto(f"{url}/assets/joined_clicks?view=checks")
            expect(page.get_by_text(f"Checks ({len(JOINED_CLICKS_CHECKS)})", exact=True)).to_be_visible()
            expect(page.get_by_text("Succeeded", exact=True)).to_have_count(len(JOINED_CLICKS_CHECKS))
            for name in JOINED_CLICKS_CHECKS:
                page.get_by_text(name, exact=True).first.click()
                expect(page).to_have_url(f"{url}/assets/joined_clicks?view=checks&checkDetail={name}")
                expect(page.get_by_text("Passed", exact=True)).to_be_visible()
                for label, value in counts[name].items():
                    row = page.get_by_role("row").filter(has=page.get_by_role("cell", name=label, exact=True))
                    expect(row.get_by_role("cell").last).to_have_text(str(value))
                if name == "joined_clicks_unique":
                    screenshot(page, "ui-asset-checks.png", tmp_path)

            # 4. The asset's metadata plots: one chart per numeric key, over its two materializations.
            page.goto(f"{url}/assets/joined_clicks")
            plots = page.get_by_role("button", name="Plots")
            plots.click()
            for key in ("clicks_joined", "dagster/row_count", "phase_join_total_seconds"):
                expect(page.get_by_text(key, exact=True)).to_be_visible()
            expect(page.locator("canvas").first).to_be_visible()
            plots.evaluate("e => e.scrollIntoView({block: 'start'})")
            screenshot(page, "ui-asset-plots.png", tmp_path)
    finally:
        left = stop_up(up)
    assert left == set(), f"processes outlived photon up: {left}"
    assert up.returncode == 0, (tmp_path / "up.log").read_text()[-3000:]
