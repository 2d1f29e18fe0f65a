"""Freshness under the real `photon up`: Dagster's freshness daemon evaluates joined_clicks' FreshnessPolicy
(photon_assets/freshness.py). With a one-minute fail window (the API's least), joined_clicks is fresh in its
health after a click run, stale once no click run lands for a minute (and the webhook gets one `stale`
message for it), and fresh again after the next click run; all read over the UI's /graphql."""

import json
import time

import pytest

from resources.spark.connect_server import free_port
from tests.conftest import write_lines
from tests.e2e.test_photon_run import photon
from tests.e2e.test_ui import graphql
from tests.e2e.test_up import start_up
from tests.e2e.test_up_checks import terminate, wait_for
from tests.webhook import Webhook, webhook_server

pytestmark = pytest.mark.e2e
FAIL_WINDOW_SECONDS = 60
FRESHNESS_QUERY = """{ assetNodes(assetKeys: [{path: ["joined_clicks"]}]) {
  freshnessStatusInfo { freshnessStatus freshnessStatusMetadata { lastMaterializedTimestamp } } } }"""


def freshness(url: str) -> tuple[str, float | None]:
    info = graphql(url, FRESHNESS_QUERY)["assetNodes"][0]["freshnessStatusInfo"]
    meta = info["freshnessStatusMetadata"] or {}
    return info["freshnessStatus"], meta.get("lastMaterializedTimestamp")


def stale_messages(hook: Webhook, asset: str) -> list[dict]:
    return [m for m in hook.accepted() if m["kind"] == "stale" and m["asset"] == asset]


def a_click(data_dir) -> dict:
    """A valid click line of the workload (joined already: its run changes nothing but the time)."""
    for path in sorted((data_dir / "logs" / "dc1" / "click").rglob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and "click_id" in event:
                return event
    raise AssertionError("no click line")


def test_joined_clicks_turns_stale_without_click_runs_and_fresh_after_one(tmp_path):
    data_dir = tmp_path / "data"
    generated = photon("gen", "--data-dir", str(data_dir), "--queries", "200", "--seed", "5", "--datacenters", "dc1")
    assert generated.returncode == 0, generated.stderr
    with webhook_server(Webhook()) as hook:
        env = {"PHOTON_SETTINGS": json.dumps({"joined_clicks_fresh_within_seconds": FAIL_WINDOW_SECONDS}),
               "FRESHNESS_DAEMON_INTERVAL_SECONDS": "5",  # the daemon's own knob (30 s by default)
               "PHOTON_ALERT_WEBHOOK": hook.url}
        port = free_port()
        up, url = start_up(data_dir, env, port), f"http://127.0.0.1:{port}"
        try:
            _, materialized = wait_for(lambda: (s := freshness(url))[0] == "HEALTHY" and s, "joined_clicks fresh")
            # The workload is joined: no click run lands any more.
            status, _ = wait_for(lambda: (s := freshness(url))[0] == "DEGRADED" and s, "joined_clicks stale",
                                 FAIL_WINDOW_SECONDS + 90)
            assert time.time() - materialized >= FAIL_WINDOW_SECONDS
            [alert] = wait_for(lambda: stale_messages(hook, "joined_clicks"), "the stale alert", 60)
            assert alert["url"].endswith("/assets/joined_clicks") and "stale" in alert["text"]

            # A click line arrives: the next click run makes joined_clicks fresh again.
            write_lines(data_dir / "logs" / "dc1" / "click" / "late-writer" / "0.jsonl", [a_click(data_dir)])
            wait_for(lambda: freshness(url)[0] == "HEALTHY", "joined_clicks fresh again", 120)
            assert len(stale_messages(hook, "joined_clicks")) == 1
        finally:
            terminate(up)
