"""Tests of replica lag and outages: `photon gen --replication-lag`, `photon replicate`
and photon.replication. Expected replicas are computed here from the source's bytes."""

import json
import math
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from photon import cli
from photon.gen import GenConfig, generate
from photon.replication import replicate
from tests.photon.test_gen import SMALL, check_against_disk, read_tree

LAGS = {"dc3": 300.0, "dc4": math.inf}
LAGGED = {**SMALL, "datacenters": ["dc1", "dc2", "dc3", "dc4"], "replication_lag": LAGS}


def event_time(line: bytes):
    """The line's int timestamp_us, or None (not JSON, not an object, no int field)."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    ts = event.get("timestamp_us") if isinstance(event, dict) else None
    return ts if isinstance(ts, int) and not isinstance(ts, bool) else None


def complete_lines(data: bytes) -> list[bytes]:
    return [line for line in data.splitlines(keepends=True) if line.endswith(b"\n")]


def complete_part(tree: dict[str, bytes]) -> dict[str, bytes]:
    """The tree as a replica without a cutoff holds it: complete lines only."""
    cut = {rel: data[:data.rfind(b"\n") + 1] for rel, data in tree.items()}
    return {rel: data for rel, data in cut.items() if data}


def expected_replica(source: dict[str, bytes], cutoff_us: int) -> dict[str, bytes]:
    """Each writer's output in write order, up to its first line past the cutoff."""
    by_writer = defaultdict(list)
    for rel in sorted(source):
        by_writer[rel.rsplit("/", 1)[0]].append(rel)
    expected = {}
    for files in by_writer.values():
        for rel in files:
            kept = []
            lines = source[rel].splitlines(keepends=True)
            for line in lines:
                ts = event_time(line)
                if not line.endswith(b"\n") or ts is not None and ts > cutoff_us:
                    break
                kept.append(line)
            if kept:
                expected[rel] = b"".join(kept)
            if len(kept) < len(lines):
                break  # the writer's later files wait
    return expected


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = cli.main([str(arg) for arg in argv])
    except SystemExit as exit:  # argparse errors
        code = exit.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def lagged(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("replication") / "lagged"
    return data_dir, generate(data_dir, GenConfig(**LAGGED))


# -- photon gen --replication-lag ------------------------------------------------

def test_lagging_replica_holds_each_writers_prefix_up_to_the_cutoff(lagged):
    data_dir, summary = lagged
    source = read_tree(data_dir / "logs/dc1")
    newest = max(ts for data in source.values() for line in complete_lines(data)
                 if (ts := event_time(line)) is not None)
    cutoff = newest - 300_000_000
    assert summary["replicas"]["dc3"] == {"lag_seconds": 300.0, "cutoff_us": cutoff,
                                          "bytes": sum(map(len, read_tree(data_dir / "logs/dc3").values()))}

    replica = read_tree(data_dir / "logs/dc3")
    assert replica == expected_replica(source, cutoff)
    # Each file is a strict or full prefix; the first line left behind is past the cutoff.
    for rel, data in replica.items():
        assert source[rel].startswith(data) and data.endswith(b"\n")
        assert all(event_time(line) is None or event_time(line) <= cutoff for line in complete_lines(data))
        rest = complete_lines(source[rel][len(data):])
        assert not rest or event_time(rest[0]) > cutoff
    # A real lag: files cut in the middle, files not there yet, both streams present.
    assert any(len(data) < len(source[rel]) for rel, data in replica.items())
    assert set(replica) < set(source)
    assert {rel.split("/")[0] for rel in replica} == {"query", "click"}
    assert any(event_time(line) is None for data in replica.values() for line in complete_lines(data))  # bad lines


def test_stopped_replica_is_empty_and_unlagged_replicas_are_identical(lagged):
    data_dir, summary = lagged
    logs = data_dir / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["dc1", "dc2", "dc3", "dc4"]
    assert sorted(p.relative_to(logs / "dc4").as_posix() for p in (logs / "dc4").rglob("*")) == ["click", "query"]
    assert summary["replicas"]["dc4"] == {"lag_seconds": "inf", "cutoff_us": None, "bytes": 0}
    # Without a lag: written by the writers as before, torn line included.
    source = read_tree(logs / "dc1")
    assert read_tree(logs / "dc2") == source
    assert summary["torn_lines"] == 1 and not source[summary["torn_file"]].endswith(b"\n")
    for dc in ("dc1", "dc2"):
        assert summary["replicas"][dc] == {"lag_seconds": None, "cutoff_us": None,
                                           "bytes": sum(map(len, source.values()))}
    # The ground truth stays that of the source.
    check_against_disk(logs / "dc1", summary, SMALL["max_line_bytes"])
    assert json.loads((data_dir / "gen_summary.json").read_text(encoding="utf-8")) == summary
    assert summary["config"]["replication_lag"] == {"dc3": 300.0, "dc4": "inf"}


def test_withhold_then_only_late_with_lags_equals_a_full_run(tmp_path, lagged):
    full_dir, full_summary = lagged
    data_dir = tmp_path / "split"
    withheld = generate(data_dir, GenConfig(**LAGGED, withhold_late=True))
    late_writers = set(withheld["writers"]["late_query"])
    lagging = read_tree(data_dir / "logs/dc3")
    assert lagging and not any(rel.split("/")[1] in late_writers for rel in lagging)
    assert withheld["replicas"]["dc3"]["cutoff_us"] == full_summary["replicas"]["dc3"]["cutoff_us"]
    with pytest.raises(ValueError, match="same options"):
        generate(data_dir, GenConfig(**{**LAGGED, "replication_lag": {"dc3": 10.0}}, only_late=True))

    completed = generate(data_dir, GenConfig(**LAGGED, only_late=True))
    assert read_tree(data_dir / "logs") == read_tree(full_dir / "logs")
    assert completed == full_summary


# -- photon replicate ------------------------------------------------------------

def test_replicate_resumes_an_outage_and_is_idempotent(tmp_path, capsys, lagged):
    data_dir = tmp_path / "copy"
    shutil.copytree(lagged[0], data_dir)
    logs = data_dir / "logs"
    source = read_tree(logs / "dc1")
    complete = complete_part(source)

    code, out, err = run_cli(capsys, "replicate", "--data-dir", data_dir, "--to", "dc4")  # --from: dc1 from the summary
    lines = sum(len(complete_lines(data)) for data in complete.values())
    assert (code, err) == (0, "")
    assert out == (f"files_created={len(complete)} files_extended=0 bytes_appended={sum(map(len, complete.values()))}"
                   f" lines_appended={lines}\n")
    assert read_tree(logs / "dc4") == complete  # the torn partial line stays behind

    lag_tree = read_tree(logs / "dc3")
    code, out, _ = run_cli(capsys, "replicate", "--data-dir", data_dir, "--to", "dc3", "--from", "dc1")
    extended = sum(rel in lag_tree and complete[rel] != lag_tree[rel] for rel in complete)
    missing = complete.keys() - lag_tree.keys()
    missing_bytes = sum(map(len, complete.values())) - sum(map(len, lag_tree.values()))
    missing_lines = lines - sum(len(complete_lines(data)) for data in lag_tree.values())
    assert code == 0 and extended > 0 and missing
    assert out == (f"files_created={len(missing)} files_extended={extended} bytes_appended={missing_bytes}"
                   f" lines_appended={missing_lines}\n")
    assert read_tree(logs / "dc3") == complete

    for dc in ("dc3", "dc4"):
        code, out, _ = run_cli(capsys, "replicate", "--data-dir", data_dir, "--to", dc)
        assert (code, out) == (0, "files_created=0 files_extended=0 bytes_appended=0 lines_appended=0\n")
    assert read_tree(logs / "dc1") == source


def test_replicate_with_a_lag_matches_the_generated_lag(tmp_path, capsys, lagged):
    data_dir = tmp_path / "copy"
    shutil.copytree(lagged[0], data_dir)
    code, _, _ = run_cli(capsys, "replicate", "--data-dir", data_dir, "--to", "dc5", "--lag-seconds", 300)
    assert code == 0
    assert read_tree(data_dir / "logs/dc5") == read_tree(data_dir / "logs/dc3")
    assert (data_dir / "logs/dc5/query").is_dir() and (data_dir / "logs/dc5/click").is_dir()


# -- photon.replication ------------------------------------------------------------

def write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        f.write(data)


def ts_line(ts) -> bytes:
    return json.dumps({"timestamp_us": ts}).encode() + b"\n"


def test_bad_lines_travel_along_and_partial_lines_stay_behind(tmp_path):
    source, target = tmp_path / "src", tmp_path / "dst"
    bad = [b"{not json\n", b"[1, 2]\n", ts_line("abc"), ts_line(True), b"\xff\xfe\n", b"[" * 100_000 + b"\n"]
    write(source / "click/w/00000.jsonl", ts_line(1) + b"".join(bad) + ts_line(2) + ts_line(5) + ts_line(3)
          + b'{"timestamp_us": 4')
    write(source / "query/late/00000.jsonl", ts_line(10))  # first line past the cutoff: not created
    write(source / "query/w/00000.jsonl", ts_line(1) + ts_line(9))
    write(source / "query/w/00001.jsonl", ts_line(1) + ts_line(10))  # waits for its cut predecessor

    stats = replicate(source, target, cutoff_us=2)
    assert (stats.files_created, stats.files_extended, stats.lines_appended) == (2, 0, 3 + len(bad))
    assert read_tree(target) == {"click/w/00000.jsonl": ts_line(1) + b"".join(bad) + ts_line(2),
                                 "query/w/00000.jsonl": ts_line(1)}
    assert stats.bytes_appended == sum(map(len, read_tree(target).values()))
    assert vars(replicate(source, target, cutoff_us=4)) == vars(replicate(source, target, cutoff_us=2)) == {
        "files_created": 0, "files_extended": 0, "bytes_appended": 0, "lines_appended": 0}

    stats = replicate(source, target)
    assert (stats.files_created, stats.files_extended, stats.lines_appended) == (2, 2, 6)
    assert read_tree(target) == complete_part(read_tree(source))
    write(source / "click/w/00000.jsonl", b"}\n")  # the write in progress completes
    assert replicate(source, target).lines_appended == 1
    assert read_tree(target) == read_tree(source)


@pytest.mark.parametrize("damage, message", [
    (lambda t: write(t / "query/w/00000.jsonl", ts_line(99)), "is longer than"),
    (lambda t: write(t / "query/w/00000.jsonl", ts_line(7)), "is not a prefix"),
    (lambda t: write(t / "click/other/00000.jsonl", ts_line(1)), "has no counterpart"),
])
def test_a_target_that_is_not_a_prefix_is_refused_untouched(tmp_path, damage, message):
    source, target = tmp_path / "src", tmp_path / "dst"
    write(source / "click/w/00000.jsonl", ts_line(1) + ts_line(2))
    write(source / "query/w/00000.jsonl", ts_line(1))
    write(target / "click/w/00000.jsonl", ts_line(1))
    damage(target)
    before = read_tree(target)
    with pytest.raises(ValueError, match=message):
        replicate(source, target)
    assert read_tree(target) == before  # in particular click/w/00000.jsonl was not extended


# -- one-line errors -----------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["gen", "--replication-lag", "dc2"], "argument --replication-lag: expected DC=SECONDS"),
    (["gen", "--replication-lag", "dc2=x"], "expected DC=SECONDS"),
    (["gen", "--datacenters", "dc1,dc2", "--replication-lag", "dc2=1,dc2=2"], "dc2 is given twice"),
    (["gen", "--datacenters", "dc1,dc2", "--replication-lag", "dc3=5"], "replication_lag names 'dc3', not among"),
    (["gen", "--datacenters", "dc1,dc2", "--replication-lag", "dc1=5"], "dc1 is the source replica"),
    (["gen", "--datacenters", "dc1,dc2", "--replication-lag", "dc2=-1"], "must be a number of seconds >= 0"),
    (["gen", "--datacenters", "dc1,dc2", "--replication-lag", "dc2=5", "--follow"],
     "replication lag is for batch mode; use photon replicate"),
    (["replicate", "--to", "dc2"], "gen_summary.json to name the source replica; give --from"),
    (["replicate", "--to", "dc1", "--from", "dc1"], "--from and --to are both dc1"),
    (["replicate", "--to", "dc2", "--from", "dc1"], "does not exist"),
    (["replicate", "--to", "../x", "--from", "dc1"], "invalid datacenter name '../x'"),
    (["replicate", "--to", "dc2", "--from", "dc1", "--lag-seconds", "-1"], "--lag-seconds must be"),
])
def test_command_line_errors_are_one_line(tmp_path, capsys, argv, message):
    data_dir = tmp_path / "data"
    code, out, err = run_cli(capsys, argv[0], "--data-dir", data_dir, *argv[1:])
    assert (code, out) == (2, "")
    assert err.startswith("photon: error: ") and err.count("\n") == 1 and message in err, err
    assert not (data_dir / "logs").exists()


def test_replicate_refuses_a_replica_ahead_of_its_source(tmp_path, capsys, lagged):
    data_dir = tmp_path / "copy"
    shutil.copytree(lagged[0], data_dir)
    before = read_tree(data_dir / "logs")
    code, out, err = run_cli(capsys, "replicate", "--data-dir", data_dir, "--from", "dc3", "--to", "dc2")
    assert (code, out) == (2, "")
    assert err.startswith("photon: error: ") and err.count("\n") == 1 and "not a replica of the source" in err
    assert read_tree(data_dir / "logs") == before
