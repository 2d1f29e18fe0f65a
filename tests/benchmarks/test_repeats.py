"""Repeats of the live and backlog benchmarks merged: each figure with every run's value and min-max,
only for results of one kind and workload, of clean commits with HEAD's product code."""

import pytest

from benchmarks import repeats

pytestmark = pytest.mark.benchmarks

LIVE_WORKLOAD = {"rate_clicks_per_second": 1000.0, "duration_seconds": 900.0, "seed": 2026}


def live(commit: str, p90: float, hold_query: float, joined: int = 100, calibration: float = 0.05) -> dict:
    photon = {"latency_seconds_all_joinable": {"p50": 2.0, "p90": p90, "p99": 9.0}, "joinable_clicks": 100,
              "joined_visible": joined, "peak_pss_bytes": 3 * 2**30, "cpu_seconds_per_1000_joined_clicks": 1.4,
              "upkeep_hold_criterion": {
                  "query": {"hold_max_seconds": hold_query, "alone_hold_max_seconds": 1.5, "allowance_seconds": 2.0,
                            "met": hold_query <= 3.5}}}
    flink = {"latency_seconds_all_joinable": {"p50": 20.0, "p90": 35.0, "p99": 49.0}, "joinable_clicks": 100,
             "joined_visible": 100, "peak_pss_bytes": 8 * 2**30, "cpu_seconds_per_1000_joined_clicks": 1.9}
    return {"benchmark": "live-15min-all", "commit": commit, "date": "2026-12-07", "command": "run.py live",
            "machine": {"cpu_calibration_seconds": calibration}, "workload": LIVE_WORKLOAD,
            "systems": {"photon": photon, "flink": flink}}


def backlog(commit: str, wall: float, missing: int = 0) -> dict:
    row = {"wall_seconds": wall, "wall_to_done_seconds": wall + 1, "joined_clicks_per_second": 2000.0,
           "peak_pss_bytes": 2**31, "correctness": {"missing_clicks": missing, "extra_clicks": 0}}
    return {"benchmark": "backlog", "commit": commit, "date": "2026-12-07", "command": "run.py backlog",
            "machine": {"cpu_calibration_seconds": 0.06}, "workload": {"query_events": 2000000, "input_bytes": 7},
            "targets": {}, "systems": {"photon": row}}


def test_two_live_runs_merge_into_each_figure_with_every_runs_value_and_min_max():
    merged = repeats.merge([live("aaa", 4.3, 2.4), live("bbb", 5.5, 4.1, joined=99, calibration=0.07)],
                           check_commit=lambda a, b: True)
    photon = merged["systems"]["photon"]
    assert merged["repeats_of"] == "live"
    assert [r["cpu_calibration_seconds"] for r in merged["merged_from"]] == [0.05, 0.07]
    assert photon["p90_seconds"] == {"runs": [4.3, 5.5], "min": 4.3, "max": 5.5}
    # The per-run criteria stay per run: a miss in one run is not hidden by the other.
    assert photon["every_joinable_visible"] == {"runs": [True, False]}
    assert photon["hold_query_met"] == {"runs": [True, False]}
    assert photon["hold_query_seconds"] == {"runs": [2.4, 4.1], "min": 2.4, "max": 4.1}
    assert "hold_query_met" not in merged["systems"]["flink"]  # a peer has no hold
    table = repeats.table(merged)
    assert "| photon |" in table and "4.3-5.5" in table and "3.00-3.00 GiB" in table and "yes, no" in table


def test_backlog_repeats_merge_and_what_does_not_merge():
    merged = repeats.merge([backlog("aaa", 90.0), backlog("bbb", 96.5, missing=2)], check_commit=lambda a, b: True)
    assert merged["repeats_of"] == "backlog"
    assert merged["systems"]["photon"]["wall_seconds"] == {"runs": [90.0, 96.5], "min": 90.0, "max": 96.5}
    assert merged["systems"]["photon"]["missing_clicks"]["max"] == 2
    with pytest.raises(SystemExit, match="different benchmarks"):
        repeats.merge([live("aaa", 4.3, 2.4), backlog("aaa", 90.0)], check_commit=lambda a, b: True)
    with pytest.raises(SystemExit, match="dirty"):
        repeats.merge([live("aaa-dirty", 4.3, 2.4)], check_commit=lambda a, b: True)
    with pytest.raises(SystemExit, match="not the product code"):
        repeats.merge([live("aaa", 4.3, 2.4)], check_commit=lambda a, b: False)
    other = live("bbb", 4.3, 2.4)
    other["workload"] = {**LIVE_WORKLOAD, "rate_clicks_per_second": 2000.0}
    with pytest.raises(SystemExit, match="workloads differ"):
        repeats.merge([live("aaa", 4.3, 2.4), other], check_commit=lambda a, b: True)
    with pytest.raises(SystemExit, match="rate curve"):
        repeats.merge([{"max_rate_p90_under_10s": {}, "workload": {}}], check_commit=lambda a, b: True)

