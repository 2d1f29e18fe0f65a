"""Tests of the workload generator: they read the files back independently
and check them against the format and against the generator's ground truth."""

import argparse
import json
import math
import re
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from photon.gen import GenConfig, add_arguments, config_from_args, generate

SMALL = dict(
    queries=4000,
    span_seconds=600,
    click_share=0.5,
    late_query_share=0.1,
    orphan_click_share=0.05,
    duplicate_click_share=0.05,
    bad_lines=10,
    max_line_bytes=4096,
    rotate_bytes=16384,
    datacenters=["dc1", "dc2"],
)

FILE_PATH = re.compile(r"(query|click)/(\d+\.\d+\.\d+\.\d+)_(\d+)/(\d{5})\.jsonl")
EVENT_ID = re.compile(r"(\d+\.\d+\.\d+\.\d+):(\d+):(\d+)")


def run(tmp_path: Path, name: str, **options) -> tuple[Path, dict]:
    data_dir = tmp_path / name
    return data_dir, generate(data_dir, GenConfig(**{**SMALL, **options}))


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# -- strict validation of a line ----------------------------------------------

def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def valid_id(value, writer: str | None, ts) -> bool:
    """Well-formed id; with a writer, minted by it at timestamp ts."""
    match = isinstance(value, str) and EVENT_ID.fullmatch(value)
    if not match:
        return False
    return writer is None or (f"{match[1]}_{match[2]}" == writer and int(match[3]) == ts)


def parse_valid(line: bytes, stream: str, writer: str, max_line_bytes: int) -> dict | None:
    """The event if the complete line is a valid event of its stream, else None."""
    if len(line) > max_line_bytes or not line.endswith(b"\n"):
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict) or not is_int(event.get("timestamp_us")):
        return None
    ts = event["timestamp_us"]
    if stream == "query":
        ads = event.get("ads")
        ok = (valid_id(event.get("query_id"), writer, ts) and isinstance(event.get("query_text"), str)
              and isinstance(ads, list) and 1 <= len(ads) <= 4
              and all(isinstance(ad, dict) and isinstance(ad.get("ad_id"), str)
                      and isinstance(ad.get("advertiser_id"), str) and is_int(ad.get("position"))
                      and is_int(ad.get("bid_micros")) for ad in ads))
    else:
        ok = (valid_id(event.get("click_id"), writer, ts) and valid_id(event.get("query_id"), None, None)
              and isinstance(event.get("ad_id"), str) and isinstance(event.get("advertiser_id"), str)
              and is_int(event.get("cost_micros")))
    return event if ok else None


class Scan:
    """Everything found in one replica, classified line by line."""

    def __init__(self, root: Path, max_line_bytes: int):
        self.queries: dict[str, dict] = {}
        self.click_lines: list[dict] = []
        self.bad = Counter()
        self.bad_raw: list[bytes] = []
        self.torn: list[tuple[str, bytes]] = []
        by_writer = defaultdict(list)
        for rel in read_tree(root):
            match = FILE_PATH.fullmatch(rel)
            assert match, f"unexpected file {rel}"
            by_writer[(match[1], f"{match[2]}_{match[3]}")].append(rel)
        self.writers = by_writer
        for (stream, writer), files in sorted(by_writer.items()):
            assert [int(f[-11:-6]) for f in files] == list(range(len(files))), files
            last_ts, seen_clicks = -1, set()
            for rel in files:
                data = (root / rel).read_bytes()
                lines = data.splitlines(keepends=True)
                for i, line in enumerate(lines):
                    if not line.endswith(b"\n"):
                        assert i == len(lines) - 1
                        self.torn.append((rel, line))
                        continue
                    event = parse_valid(line, stream, writer, max_line_bytes)
                    if event is None:
                        self.bad[stream] += 1
                        self.bad_raw.append(line)
                        continue
                    if stream == "query":
                        assert event["query_id"] not in self.queries
                        self.queries[event["query_id"]] = event
                    else:
                        self.click_lines.append(event)
                        if event["click_id"] in seen_clicks:
                            continue  # a duplicate repeats an earlier line of this writer
                        seen_clicks.add(event["click_id"])
                    assert event["timestamp_us"] > last_ts, (rel, i)
                    last_ts = event["timestamp_us"]


def check_against_disk(root: Path, summary: dict, max_line_bytes: int) -> Scan:
    scan = Scan(root, max_line_bytes)
    clicks = {}
    for event in scan.click_lines:
        if event["click_id"] in clicks:
            assert clicks[event["click_id"]] == event  # duplicates are identical
        clicks[event["click_id"]] = event
    duplicates = sorted(c for c, n in Counter(e["click_id"] for e in scan.click_lines).items() for _ in range(n - 1))
    joinable = sorted(c for c, e in clicks.items() if e["query_id"] in scan.queries)
    unmatched = sorted(c for c, e in clicks.items() if e["query_id"] not in scan.queries)

    assert summary["query_events"] == len(scan.queries)
    assert summary["click_lines"] == len(scan.click_lines)
    assert summary["distinct_click_ids"] == len(clicks)
    assert summary["duplicate_click_lines"] == len(scan.click_lines) - len(clicks)
    assert summary["duplicate_click_ids"] == duplicates
    assert summary["joinable_clicks"] == len(joinable)
    assert summary["joinable_click_ids"] == joinable
    withheld_late = summary["late_click_ids"] if summary["late_withheld"] else []
    assert sorted(summary["orphan_click_ids"] + withheld_late) == unmatched
    assert summary["orphan_clicks"] == len(summary["orphan_click_ids"])
    assert summary["bad_lines"] == sum(scan.bad.values())
    assert summary["bad_lines_by_stream"] == {"query": scan.bad["query"], "click": scan.bad["click"]}
    assert summary["torn_lines"] == len(scan.torn)
    assert [rel for rel, _ in scan.torn] == ([summary["torn_file"]] if summary["torn_file"] else [])
    late_writers = set(summary["writers"]["late_query"])
    on_disk_late = [q for q in scan.queries if q.split(":")[0] + "_" + q.split(":")[1] in late_writers]
    assert len(on_disk_late) == summary["late_query_events"] - summary["withheld_late_query_events"]

    # Clicks are consistent with the query they point at.
    for click_id in joinable:
        click = clicks[click_id]
        query = scan.queries[click["query_id"]]
        ads = {ad["ad_id"]: ad for ad in query["ads"]}
        assert click["ad_id"] in ads
        assert click["advertiser_id"] == ads[click["ad_id"]]["advertiser_id"]
        assert 1 <= click["cost_micros"] <= ads[click["ad_id"]]["bid_micros"]
        assert click["timestamp_us"] > query["timestamp_us"]
    return scan


# -- fixtures -------------------------------------------------------------------

@pytest.fixture(scope="module")
def full(tmp_path_factory):
    return run(tmp_path_factory.mktemp("gen"), "full")


# -- tests ----------------------------------------------------------------------

def test_same_seed_gives_identical_bytes_other_seed_differs(tmp_path, full):
    data_dir, summary = full
    again_dir, again = run(tmp_path, "again")
    assert read_tree(again_dir) == read_tree(data_dir)
    assert again == summary
    other_dir, _ = run(tmp_path, "other", seed=2)
    assert read_tree(other_dir / "logs/dc1") != read_tree(data_dir / "logs/dc1")


def test_replicas_are_identical(full):
    data_dir, _ = full
    dc1 = read_tree(data_dir / "logs/dc1")
    assert dc1 and read_tree(data_dir / "logs/dc2") == dc1
    assert sorted(p.name for p in (data_dir / "logs").iterdir()) == ["dc1", "dc2"]


def test_summary_matches_disk(full):
    data_dir, summary = full
    assert json.loads((data_dir / "gen_summary.json").read_text(encoding="utf-8")) == summary
    scan = check_against_disk(data_dir / "logs/dc1", summary, SMALL["max_line_bytes"])
    # The workload really has each feature.
    assert summary["query_events"] == SMALL["queries"]
    assert summary["late_query_events"] > 0 and summary["late_clicks"] > 0
    assert summary["orphan_clicks"] > 0 and summary["duplicate_click_lines"] > 0
    assert summary["bad_lines"] == SMALL["bad_lines"] and summary["torn_lines"] == 1
    assert 0.4 < summary["distinct_click_ids"] / SMALL["queries"] < 0.6
    assert all(len(e["ads"]) in (1, 2, 3, 4) for e in scan.queries.values())
    assert any("country" in e and "device" in e for e in scan.queries.values())


def test_files_rotate_at_rotate_bytes(full):
    data_dir, _ = full
    root = data_dir / "logs/dc1"
    scan = Scan(root, SMALL["max_line_bytes"])
    assert max(len(files) for files in scan.writers.values()) > 2
    for files in scan.writers.values():
        for rel in files[:-1]:
            data = (root / rel).read_bytes()
            last_line = data.splitlines(keepends=True)[-1]
            # Full once the last line was added, not before.
            assert len(data) >= SMALL["rotate_bytes"] > len(data) - len(last_line)


def test_torn_line_is_a_prefix_of_a_click_line(full):
    data_dir, summary = full
    root = data_dir / "logs/dc1"
    torn_file = summary["torn_file"]
    assert torn_file.startswith("click/")
    assert torn_file == Scan(root, SMALL["max_line_bytes"]).writers[("click", torn_file.split("/")[1])][-1]
    data = (root / torn_file).read_bytes()
    fragment = data[data.rindex(b"\n") + 1:]
    assert fragment.startswith(b'{"click_id":"') and len(fragment) > 20
    with pytest.raises(ValueError):
        json.loads(fragment)
    # No other file lacks its final newline.
    for rel, content in read_tree(root).items():
        assert rel == torn_file or content.endswith(b"\n")


def test_bad_lines_cover_every_kind(full):
    data_dir, _ = full
    scan = Scan(data_dir / "logs/dc1", SMALL["max_line_bytes"])
    kinds = Counter()
    for line in scan.bad_raw:
        assert line.endswith(b"\n")
        if len(line) > SMALL["max_line_bytes"]:
            kinds["overlong"] += 1
            continue
        try:
            event = json.loads(line)
        except ValueError:
            kinds["not_json"] += 1
            continue
        if not isinstance(event, dict):
            kinds["not_object"] += 1
        elif "ads" not in event and "query_text" in event or "query_id" not in event:
            kinds["missing_field"] += 1
        else:
            kinds["mistyped"] += 1
    assert kinds == {"overlong": 2, "not_json": 2, "not_object": 2, "missing_field": 2, "mistyped": 2}
    assert scan.bad == {"query": 5, "click": 5}


def test_withhold_then_only_late_equals_full_run(tmp_path, full):
    full_dir, full_summary = full
    data_dir, withheld = run(tmp_path, "split", withhold_late=True)
    late_writers = withheld["writers"]["late_query"]
    on_disk = read_tree(data_dir / "logs")
    expected_late = {rel for rel in read_tree(full_dir / "logs") if rel.split("/")[2] in late_writers}
    assert expected_late and set(on_disk) == set(read_tree(full_dir / "logs")) - expected_late
    assert withheld["late_withheld"] and withheld["withheld_late_query_events"] == full_summary["late_query_events"]
    assert withheld["query_events"] == full_summary["query_events"] - full_summary["late_query_events"]
    check_against_disk(data_dir / "logs/dc1", withheld, SMALL["max_line_bytes"])

    completed = generate(data_dir, GenConfig(**{**SMALL, "only_late": True}))
    assert read_tree(data_dir / "logs") == read_tree(full_dir / "logs")
    assert completed == full_summary
    assert json.loads((data_dir / "gen_summary.json").read_text(encoding="utf-8")) == full_summary

    with pytest.raises(ValueError, match="withhold_late run"):
        generate(data_dir, GenConfig(**{**SMALL, "only_late": True}))


def test_only_late_needs_a_matching_withheld_run(tmp_path):
    with pytest.raises(ValueError, match="only_late needs"):
        run(tmp_path, "none", only_late=True)
    data_dir, _ = run(tmp_path, "split", withhold_late=True)
    with pytest.raises(ValueError, match="same options"):
        generate(data_dir, GenConfig(**{**SMALL, "only_late": True, "seed": 7}))


def test_refuses_a_data_dir_with_logs(tmp_path):
    data_dir, _ = run(tmp_path, "once", queries=10)
    with pytest.raises(ValueError, match="already contains files"):
        generate(data_dir, GenConfig(**{**SMALL, "queries": 10}))


def test_defaults_and_edge_cases(tmp_path):
    config = GenConfig()
    assert (config.queries, config.span_seconds, config.start_time_us) == (20000, 3600.0, 1763700000000000)
    assert (config.query_writers, config.click_writers, config.rotate_bytes) == (4, 2, 262144)
    assert config.datacenters == ["dc1"]
    data_dir, summary = run(tmp_path, "empty", queries=0, datacenters=["dc1"])
    assert summary["query_events"] == summary["click_lines"] == summary["torn_lines"] == 0
    check_against_disk(data_dir / "logs/dc1", summary, SMALL["max_line_bytes"])
    data_dir, summary = run(tmp_path, "plain", queries=500, bad_lines=0, duplicate_click_share=0,
                            orphan_click_share=0, late_query_share=0, torn_last_line=False)
    assert summary["bad_lines"] == summary["torn_lines"] == summary["orphan_clicks"] == 0
    assert summary["joinable_clicks"] == summary["click_lines"] > 0
    check_against_disk(data_dir / "logs/dc2", summary, SMALL["max_line_bytes"])


@pytest.mark.parametrize("options, message", [
    ({"queries": -1}, "queries must not be negative"),
    ({"bad_lines": -3}, "bad_lines must not be negative"),
    ({"click_share": 1.5}, "click_share must be between 0 and 1"),
    ({"late_query_share": -0.1}, "late_query_share must be between 0 and 1"),
    ({"duplicate_click_share": float("nan")}, "must be a finite number"),
    ({"queries": 2.5}, "queries must be an integer"),
    ({"query_writers": 0}, "query_writers must be at least 1"),
    ({"span_seconds": 0}, "span_seconds must be positive"),
    ({"rotate_bytes": 10}, "rotate_bytes must be at least 1024"),
    ({"datacenters": ["dc1", "a/b"]}, "invalid datacenter name 'a/b'"),
    ({"datacenters": [".."]}, "invalid datacenter name"),
    ({"datacenters": [""]}, "invalid datacenter name"),
    ({"datacenters": []}, "datacenters must be a non-empty list"),
    ({"datacenters": ["dc1", "dc1"]}, "datacenters must be distinct"),
    ({"withhold_late": True, "only_late": True}, "exclude each other"),
    ({"follow": True, "withhold_late": True}, "batch only"),
    ({"follow": True, "click_share": 0}, "click_share > 0"),
    ({"replication_lag": ["dc2"]}, "replication_lag must map datacenters to seconds"),
    ({"datacenters": ["dc1", "dc2"], "replication_lag": {"dc3": 1.0}},
     "names 'dc3', not among the datacenters dc1,dc2"),
    ({"datacenters": ["dc1", "dc2"], "replication_lag": {"dc1": 0.0}}, "dc1 is the source replica"),
    ({"datacenters": ["dc1", "dc2"], "replication_lag": {"dc2": -1.0}}, "replication lag of dc2 must be"),
    ({"datacenters": ["dc1", "dc2"], "replication_lag": {"dc2": float("nan")}}, "replication lag of dc2 must be"),
    ({"datacenters": ["dc1", "dc2"], "replication_lag": {"dc2": "5"}}, "replication lag of dc2 must be"),
    ({"datacenters": ["dc1", "dc2"], "replication_lag": {"dc2": 5.0}, "follow": True},
     "replication lag is for batch mode; use photon replicate"),
])
def test_invalid_options_raise(options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        GenConfig(**options)


def test_command_line_options():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert config_from_args(parser.parse_args([])) == GenConfig()
    args = parser.parse_args(["--queries", "10", "--seed", "3", "--datacenters", "dc1,dc2", "--withhold-late",
                              "--click-share", "0.2", "--no-torn-last-line", "--rotate-bytes", "4096"])
    assert config_from_args(args) == GenConfig(queries=10, seed=3, datacenters=["dc1", "dc2"], withhold_late=True,
                                               click_share=0.2, torn_last_line=False, rotate_bytes=4096)
    with pytest.raises(ValueError, match="invalid datacenter name"):
        config_from_args(parser.parse_args(["--datacenters", "dc1,x/y"]))
    args = parser.parse_args(["--datacenters", "dc1,dc2,dc3", "--replication-lag", "dc2=30, dc3=inf"])
    assert config_from_args(args).replication_lag == {"dc2": 30.0, "dc3": math.inf}


def test_follow_mode_appends_in_real_time(tmp_path):
    data_dir = tmp_path / "follow"
    config = GenConfig(follow=True, rate=300, click_share=0.5, duration_s=1.5, flush_interval_s=0.1,
                       late_delay_s=0.5, click_delay_mean_s=0.2, click_delay_max_s=1.0, bad_lines=5,
                       duplicate_click_share=0.1, orphan_click_share=0.1, rotate_bytes=8192,
                       datacenters=["dc1", "dc2"])
    started = time.time_ns() // 1000
    summary = generate(data_dir, config)
    finished = time.time_ns() // 1000
    assert read_tree(data_dir / "logs/dc1") == read_tree(data_dir / "logs/dc2")
    scan = check_against_disk(data_dir / "logs/dc1", summary, config.max_line_bytes)
    assert summary["query_events"] > 500 and summary["click_lines"] > 50
    assert summary["late_query_events"] > 0 and summary["bad_lines"] == 5 and summary["torn_lines"] == 1
    assert all(started <= q["timestamp_us"] <= finished for q in scan.queries.values())


def test_follow_mode_files_grow_and_show_partial_lines_while_running(tmp_path):
    data_dir = tmp_path / "live"
    config = GenConfig(follow=True, rate=200, click_share=0.5, duration_s=1.2, flush_interval_s=0.1,
                       click_delay_mean_s=0.1, click_delay_max_s=0.3, bad_lines=0)
    runner = threading.Thread(target=generate, args=(data_dir, config))
    runner.start()
    sizes, partial_seen = [], False
    while runner.is_alive():
        files = read_tree(data_dir / "logs") if (data_dir / "logs").exists() else {}
        sizes.append(sum(map(len, files.values())))
        partial_seen |= any(rel.split("/")[1] == "click" and data and not data.endswith(b"\n")
                            for rel, data in files.items())
        time.sleep(0.05)
    runner.join()
    assert len(set(sizes)) >= 4 and sizes == sorted(sizes)  # append-only, growing
    assert partial_seen
    summary = json.loads((data_dir / "gen_summary.json").read_text(encoding="utf-8"))
    check_against_disk(data_dir / "logs/dc1", summary, config.max_line_bytes)
