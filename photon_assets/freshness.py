"""Freshness policies (Dagster's `FreshnessPolicy`) on the assets a live pipeline keeps changing:
`joined_clicks` (every click pass) and `click_aggregates` (a refresh every aggregates_refresh_seconds
while clicks are joined). Under `photon up` Dagster's freshness daemon (dagster.yaml: `freshness`,
photon/deployment.py) evaluates them every 30 s and records each change of state (a
`FRESHNESS_STATE_CHANGE` event: PASS, WARN, FAIL), which the asset's health shows and the alert
sensor reports (sensors/alerts.py). They judge liveness, not content: a data directory processed
yesterday is correct, and `verify` / `photon check` do not look at age.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Sequence

import dagster as dg

FRESH_ASSETS = ("joined_clicks", "click_aggregates")
# Dagster refuses a window under a minute (TimeWindowFreshnessPolicy: "system constraints").
MIN_WINDOW_SECONDS = 60


def freshness_policy(fresh_within_seconds: float) -> dg.FreshnessPolicy:
    """Fails after `fresh_within_seconds` (PipelineSettings.joined_clicks_fresh_within_seconds) without a
    materialization; warns after half of it, when that half is a minute or more (a fail window under two
    minutes has no warn window)."""
    fail = max(MIN_WINDOW_SECONDS, fresh_within_seconds)
    warn = max(MIN_WINDOW_SECONDS, fail / 2)
    return dg.FreshnessPolicy.time_window(fail_window=timedelta(seconds=fail),
                                          warn_window=timedelta(seconds=warn) if warn < fail else None)


def with_freshness(assets: Sequence, fresh_within_seconds: float) -> list:
    """`assets`, with the freshness policy on the specs of FRESH_ASSETS."""
    policy = freshness_policy(fresh_within_seconds)

    def apply(spec: dg.AssetSpec) -> dg.AssetSpec:
        return spec.replace_attributes(freshness_policy=policy) if spec.key.to_user_string() in FRESH_ASSETS else spec

    return [a.map_asset_specs(apply) if isinstance(a, dg.AssetsDefinition) else a for a in assets]
