"""Issue 73's harness, its pure parts: a rate held or not, `max_rate_p90_under_10s`, merging repeats,
CPU of a process tree, the replayer's plan, pacing and timestamp shift, the shipper's complete files."""

import copy
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks import rate_curve, replay
from benchmarks.latency_stages import hold_criterion
from benchmarks.peers import newly_complete
from benchmarks.run import Measured, peer_rotate_bytes

pytestmark = pytest.mark.benchmarks


def run_of(p90: float | None, minutes: dict[int, float], joined: int = 100, joinable: int = 100,
           tick_late: float = 0.0, tick_late_p50: float = 0.0) -> dict:
    return {"latency_seconds_all_joinable": {"p50": 1.0, "p90": p90, "p99": 20.0},
            "latency_by_minute_of_click_time": {str(m): {"p90": v} for m, v in minutes.items()},
            "joined_visible": joined, "joinable_clicks": joinable, "cpu_seconds": 30.0,
            "cpu_seconds_per_1000_joined_clicks": 300.0, "peak_pss_bytes": 2**31,
            "feed": {"kind": "replay", "cpu_seconds": 1.0, "tick_late_seconds": {"p50": tick_late_p50, "max": tick_late}, "start_late_seconds": 0.0},
            "generated": {"clicks_per_second": 990.0, "queries_per_second": 10000.0}}


STEADY = {m: 5.0 for m in range(10)}


def test_a_rate_is_held_with_p90_under_10_s_every_click_joined_and_no_drift():
    assert rate_curve.verdict(run_of(6.0, STEADY), 1000, 600)["held"]
    assert not rate_curve.verdict(run_of(10.5, STEADY), 1000, 600)["held"]
    assert not rate_curve.verdict(run_of(None, STEADY), 1000, 600)["held"]  # over 10 % never visible
    missed = rate_curve.verdict(run_of(6.0, STEADY, joined=99), 1000, 600)
    assert missed["reasons"] == ["1 joinable clicks not joined by the drain timeout"]
    # The median of the last three full minutes (7-9 of a 600 s run) against that of minutes 1-3: 1.5x at most.
    climbing = rate_curve.verdict(run_of(6.0, {**STEADY, 1: 4.0, 2: 4.0, 8: 6.1, 9: 6.1}), 1000, 600)
    assert not climbing["held"] and climbing["drift"]["ratio"] == 1.525
    assert rate_curve.verdict(run_of(6.0, {**STEADY, 1: 4.0, 2: 4.0, 8: 6.0, 9: 6.0}), 1000, 600)["held"]
    # One minute's spike does not judge (Photon's 1,000 clicks/s minutes); the one-minute ratio is kept.
    spike = rate_curve.verdict(run_of(5.0, {0: 11.45, 1: 3.78, 2: 4.13, 3: 5.68, 4: 4.5, 5: 4.99, 6: 4.74,
                                            7: 4.32, 8: 5.06, 9: 5.8}), 1000, 600)
    assert spike["held"] and spike["drift"]["ratio"] == 1.225 and spike["drift"]["single_minute_ratio"] == 1.534
    # A run too short for a second minute to compare with is judged on the rest.
    assert rate_curve.verdict(run_of(6.0, {0: 9.0}), 1000, 30)["drift"]["ratio"] is None
    # A feed that fell behind (late at the median) or stalled means the rate was not tried: not held.
    behind = rate_curve.verdict(run_of(6.0, STEADY, tick_late=3.0, tick_late_p50=1.5), 1000, 600)
    assert behind["reasons"] == ["the feed did not keep the rate"]
    assert not rate_curve.verdict(run_of(6.0, STEADY, tick_late=5.5), 1000, 600)["held"]
    # One tick a little over a second late, the rest on time (photon-up's 1,000 clicks/s): it kept the rate.
    assert rate_curve.verdict(run_of(6.0, STEADY, tick_late=1.127), 1000, 600)["held"]


def test_the_highest_rate_held_is_the_systems_max_rate_and_none_when_none_held():
    points = [rate_curve.point(run_of(p90, STEADY), rate, 600) for rate, p90 in ((250, 3.0), (500, 4.0), (1000, 12.0))]
    assert rate_curve.max_rate_p90_under_10s(points) == 500
    assert rate_curve.max_rate_p90_under_10s(points[2:]) is None
    assert points[0]["p90_by_minute_seconds"]["9"] == 5.0 and points[0]["cpu_seconds_per_1000_joined_clicks"] == 300.0


def test_a_curve_cut_short_goes_on_with_its_runs_re_judged_and_only_what_it_lacks_run(tmp_path):
    args = SimpleNamespace(systems=["photon", "streaming"], rates=[250.0, 500.0, 1000.0], feed="gen", floors=True,
                           duration_s=600, drain_timeout_s=300, seed=7, peer_rotate_seconds=1.0,
                           late_query_share=0.0, resume=None, keep_pregenerated=False)
    p90s = {("photon", 250.0): 3.0, ("photon-floor", 250.0): 1.0, ("photon", 500.0): 4.0,
            ("streaming", 250.0): 12.0, ("streaming-floor", 250.0): 2.0,
            ("photon-floor", 500.0): 1.0, ("photon", 1000.0): 11.0, ("photon-floor", 1000.0): 1.0}
    ran = []

    def live_run(name, rate_args, work):
        ran.append((name, rate_args.rate))
        if (name, rate_args.rate) == ("photon", 500.0):  # cut short here: the floor at 500 never ran
            raise KeyboardInterrupt
        return {**run_of(p90s[(name, rate_args.rate)], STEADY), "backlog_bytes": [1, 2]}

    written = []
    with pytest.raises(KeyboardInterrupt):
        rate_curve.rate_curve(args, tmp_path, live_run, written.append)
    cut = {**copy.deepcopy(written[-1]), "commit": "abc1234", "date": "2026-12-07", "command": "run.py rate-curve"}
    cut["systems"]["photon"]["points"][0]["verdict"] = {"held": False, "reasons": ["an older verdict"]}
    (tmp_path / "cut.json").write_text(json.dumps(cut))
    ran.clear()
    p90s[("photon", 500.0)] = 4.0

    def live_run_ok(name, rate_args, work):
        ran.append((name, rate_args.rate))
        return run_of(p90s[(name, rate_args.rate)], STEADY)

    result = rate_curve.rate_curve(SimpleNamespace(**{**vars(args), "resume": str(tmp_path / "cut.json")}),
                                   tmp_path, live_run_ok, lambda r: None)
    # Streaming stopped at 250 before the cut; Photon's 250 and its floor are kept, re-judged as held.
    assert ran == [("photon", 500.0), ("photon-floor", 500.0), ("photon", 1000.0), ("photon-floor", 1000.0)]
    assert result["max_rate_p90_under_10s"] == {"photon": 500.0, "streaming": None}
    assert [p["rate_clicks_per_second"] for p in result["systems"]["photon"]["floor"]["points"]] == [250.0, 500.0, 1000.0]
    assert result["resumed_from"]["commit"] == "abc1234"
    with pytest.raises(SystemExit, match="drain_timeout_seconds"):
        rate_curve.rate_curve(SimpleNamespace(**{**vars(args), "drain_timeout_s": 600, "resume": str(tmp_path / "cut.json")}),
                              tmp_path, live_run_ok, lambda r: None)


def curve(commit: str, p90s: list[float]) -> dict:
    points = [rate_curve.point(run_of(p90, STEADY), rate, 600) for rate, p90 in zip((250.0, 500.0, 1000.0), p90s)]
    return rate_curve.finish({"commit": commit, "date": "2026-12-06", "command": "run.py rate-curve",
                              "machine": {"cpu_calibration_seconds": 0.05},
                              "systems": {"photon": {"points": points, "floor": {"points": []}}}})


def test_repeats_merge_with_each_runs_value_and_min_max_only_on_the_product_code_of_head(tmp_path):
    merged = rate_curve.merge([curve("aaa", [3.0, 4.0, 12.0]), curve("bbb", [3.5, 11.0])], check_commit=lambda a, b: True)
    rate_curve.chart(merged, tmp_path / "merged.png", {})  # each rate's min-max drawn
    assert (tmp_path / "merged.png").stat().st_size > 0
    photon = merged["systems"]["photon"]
    assert photon["max_rate_p90_under_10s"] == {"runs": [500.0, 250.0], "min": 250.0, "max": 500.0}
    first = photon["points"][0]
    assert first["p90_seconds"] == {"runs": [3.0, 3.5], "min": 3.0, "max": 3.5} and first["held"] == [True, True]
    # A rate only one run reached keeps its place, the other run's value missing.
    assert photon["points"][2]["p90_seconds"] == {"runs": [12.0, None], "min": 12.0, "max": 12.0}
    with pytest.raises(SystemExit, match="dirty"):
        rate_curve.merge([curve("aaa-dirty", [3.0])], check_commit=lambda a, b: True)
    with pytest.raises(SystemExit, match="not the product code"):
        rate_curve.merge([curve("aaa", [3.0])], check_commit=lambda a, b: False)


def test_a_curve_run_a_system_at_a_time_combines_into_one_curve_not_repeats():
    flink = curve("bbb", [20.0])
    flink["systems"] = {"flink": flink["systems"]["photon"]}
    combined = rate_curve.merge([curve("aaa", [3.0, 4.0, 12.0]), flink], check_commit=lambda a, b: True)
    assert [c["commit"] for c in combined["combined_from"]] == ["aaa", "bbb"] and "merged_from" not in combined
    assert combined["max_rate_p90_under_10s"] == {"photon": 500.0, "flink": None}
    assert combined["systems"]["photon"]["points"][1]["p90_seconds"] == 4.0  # each point as run, no min-max
    assert "| flink | 250 |" in rate_curve.table(combined)
    # Two such curves (as written: with a result's head) are repeats of one another.
    written = {**combined, "commit": "ccc", "date": "2026-12-07", "command": "run.py merge",
               "machine": {"cpu_calibration_seconds": 0.05}}
    again = rate_curve.merge([written, written], check_commit=lambda a, b: True)
    assert again["max_rate_p90_under_10s"]["photon"] == {"runs": [500.0, 500.0], "min": 500.0, "max": 500.0}


def test_a_click_run_beside_a_kind_of_run_may_be_held_two_seconds_past_the_worst_alone():
    upkeep = {"alone": {"click_runs": 9, "hold_max_seconds": 1.4}, "maintenance": {"click_runs": 3, "hold_max_seconds": 3.4},
              "query": {"click_runs": 5, "hold_max_seconds": 3.5}}
    found = hold_criterion(upkeep)
    assert found["maintenance"]["met"] and not found["query"]["met"]
    assert found["query"] == {"hold_max_seconds": 3.5, "alone_hold_max_seconds": 1.4, "allowance_seconds": 2.0, "met": False}
    assert hold_criterion({"click_runs": 2, "alone": {"click_runs": 2}}) == {}


# A tree: a child that burns 1 s and is reaped; a grandchild that burns 0.8 s while its parent lives, is
# never reaped by it (the parent exits first) and is seen by the sampler; the root itself 0.5 s.
TREE = r"""
import os, subprocess, sys, time
burn = "import time\nend = time.process_time() + {s}\nwhile time.process_time() < end: pass\n"
subprocess.run([sys.executable, "-c", burn.format(s=1.0)])
if os.fork() == 0:
    if os.fork() == 0:
        exec(burn.format(s=0.8)); os._exit(0)
    time.sleep(2.5)
    os._exit(0)
os.wait()
end = time.process_time() + 0.5
while time.process_time() < end: pass
time.sleep(1)
"""


def test_the_cpu_of_a_process_tree_counts_reaped_and_unreaped_descendants(tmp_path):
    measured = Measured([sys.executable, "-c", TREE], tmp_path / "tree.log")
    measured.run()
    # At exit the kernel's count for the root has the reaped child, not the grandchild its parent left.
    assert 1.4 <= measured.exit_rusage_cpu_seconds <= 2.0
    assert 2.2 <= measured.cpu_seconds() <= 2.9, measured.cpu_by_kind()
    assert measured.cpu.carried == pytest.approx(0.8, abs=0.15)


def test_a_peers_logs_rotate_so_that_a_click_file_completes_about_every_second():
    assert peer_rotate_bytes(250, 1.0) == 30_000
    assert peer_rotate_bytes(8000, 1.0) == 262_144  # the generator's own rotation fills faster already
    assert peer_rotate_bytes(10, 1.0) == 4096


def test_newly_complete_files_are_found_in_order_without_listing_the_writers(tmp_path):
    writer = tmp_path / "click" / "10.3.0.1_7"
    writer.mkdir(parents=True)
    seen: dict[str, int] = {}
    (writer / "00000.jsonl").write_text("a\n")
    assert newly_complete(tmp_path / "click", seen, all_complete=False) == []
    (writer / "00001.jsonl").write_text("b\n")
    (writer / "00002.jsonl").write_text("c\n")
    assert [p.name for p in newly_complete(tmp_path / "click", seen, all_complete=False)] == ["00000.jsonl", "00001.jsonl"]
    assert newly_complete(tmp_path / "click", seen, all_complete=False) == []
    assert [p.name for p in newly_complete(tmp_path / "click", seen, all_complete=True)] == ["00002.jsonl"]
    assert newly_complete(tmp_path / "no-such", seen, all_complete=True) == []


# -- the replayer --------------------------------------------------------------------------

def line(ts: int, click: bool = True) -> bytes:
    return (b'{"click_id":"10.3.0.1:7:%d","timestamp_us":%d}\n' % (ts, ts)) if click else b'not json\n'


def test_a_line_falls_due_at_its_time_or_with_the_line_before_it():
    start = 1_763_700_000_000_000
    data = line(start + 10) + line(start + 5) + line(0, click=False) + line(start + 30) + b'{"click_id":"torn'
    ends, dues, running = replay.due_times(data, start)
    assert list(ends) == [len(line(start + 10)) * k for k in (1, 2)] + [2 * len(line(start + 10)) + 9, len(data) - 17]
    # The second (a duplicate's older stamp) and the bad line go with the first; the torn tail is no line.
    assert list(dues - start) == [10, 10, 10, 30] and running == start + 30


def test_ticks_are_played_once_each_as_their_time_comes():
    assert list(replay.ticks_due(1000, 500, 900, 0)) == []
    assert list(replay.ticks_due(1000, 500, 1000, 0)) == [0]
    assert list(replay.ticks_due(1000, 500, 2600, 1)) == [1, 2, 3]
    assert list(replay.ticks_due(1000, 500, 2600, 4)) == []


def test_the_shift_moves_every_stamp_and_id_by_one_offset_keeping_lengths():
    before = (b'{"click_id":"10.3.0.1:43414:1763700002318034","query_id":"10.1.0.1:8806:1763700002071226",'
              b'"timestamp_us":1763700002318034,"cost_micros":59499}\n["10.1.0.2:5:1763700000000001", 1763700000000001]\n')
    after = replay.shift_bytes(before, 1_000_000_123)
    assert len(after) == len(before)
    assert b"10.3.0.1:43414:1763701002318157" in after and b'"timestamp_us":1763701002318157' in after
    assert b"10.1.0.1:8806:1763701002071349" in after and b", 1763701000000124]" in after
    assert b'"cost_micros":59499' in after
    assert replay.shifted_id("10.3.0.1:7:1763700000000000", 5) == "10.3.0.1:7:1763700000000005"


def test_a_replay_writes_the_pregenerated_lines_by_wall_clock_with_timestamps_of_now(tmp_path):
    """A small workload pre-generated (4 s at 20 clicks/s), then played: every writer's file holds the
    source's lines in order (the torn writer's ending with its torn half line), a line's stamp is
    when it was written (within a tick), and gen_summary.json counts what was played."""
    pre, data = tmp_path / "pre", tmp_path / "live"
    assert not replay.pregenerate(pre, 20, 4, seed=3)["reused"]
    assert replay.pregenerate(pre, 20, 4, seed=3)["reused"]
    player = subprocess.Popen([sys.executable, "benchmarks/replay.py", "play", "--source", str(pre), "--data-dir",
                               str(data), "--lead-seconds", "0.5"], cwd=Path(replay.__file__).parents[1],
                              stdout=subprocess.PIPE, text=True)
    sizes = []  # (wall time, bytes of the query logs)
    while player.poll() is None:
        logs = data / "logs" / "dc1" / "query"
        sizes.append((time.time(), sum(p.stat().st_size for p in logs.rglob("*.jsonl")) if logs.is_dir() else 0))
        time.sleep(0.1)
    played = json.loads(player.stdout.read().strip().splitlines()[-1])
    assert played["ticks"] >= 8 and played["tick_late_seconds"]["max"] < 1.0
    summary = json.loads((data / "gen_summary.json").read_text())
    start = summary["config"]["start_time_us"] / 1e6
    assert summary["config"]["follow"] and summary["replayed"]
    # Bytes arrived over the run, not at once: some before its middle, more after.
    middle = [size for at, size in sizes if start + 1.5 < at < start + 2.5]
    assert middle and 0 < middle[0] < sizes[-1][1]
    for writer in (pre / "logs" / "dc1" / "query").iterdir():
        source = b"".join(p.read_bytes() for p in sorted(writer.glob("*.jsonl")))
        copy = b"".join(p.read_bytes() for p in sorted((data / "logs" / "dc1" / "query" / writer.name).glob("*.jsonl")))
        assert copy and source.startswith(copy)  # the source was shifted in place: the same bytes
        stamps = np.array([int(t) for t in __import__("re").findall(rb'"timestamp_us":(\d{16})', copy)]) / 1e6
        assert stamps.min() >= start and stamps.max() <= start + 4.0
    # Ids in the truth are shifted with the lines: each joinable click is in a click file.
    clicks = b"".join(p.read_bytes() for p in (data / "logs" / "dc1" / "click").rglob("*.jsonl"))
    assert summary["joinable_click_ids"] and all(i.encode() in clicks for i in summary["joinable_click_ids"])
    assert summary["torn_file"] and not (data / "logs" / "dc1" / summary["torn_file"]).read_bytes().endswith(b"\n")
    assert summary["click_lines"] == played["click_lines"] and summary["query_events"] > 0


def test_a_replay_rotates_its_files_small_for_a_file_fed_peer(tmp_path):
    pre, data = tmp_path / "pre", tmp_path / "live"
    replay.pregenerate(pre, 20, 2, seed=4)
    played = replay.play(pre, data, rotate_bytes=8192, lead_seconds=0.2)
    assert played["rotate_bytes"] == 8192
    for writer in (data / "logs" / "dc1" / "query").iterdir():
        files = sorted(writer.glob("*.jsonl"))
        assert len(files) >= 3 and [p.name for p in files] == [f"{n:05d}.jsonl" for n in range(len(files))]
        # Every file but the last reached the size, and ends on a line.
        assert all(p.stat().st_size >= 8192 and p.read_bytes().endswith(b"\n") for p in files[:-1])
