"""The query tailer (photon/query_tail.py) against a real registry engine: it holds every valid query
line of the logs and no bad one, records where it read to with each put, resumes there after a
restart, starts over on a registry that holds nothing, and mirrors its progress for the dispatchers.
The lookup's fed times (spark_ops/registry_calls.py: fed_times) are what a click run vouches by."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest

from photon import gen
from photon.query_tail import QueryTailer, TailSettings
from resources.event_store.progress import QueryProgress, QueryTail
from resources.event_store.tail_segments import TailSegments
from resources.registry.shards import ShardedIdRegistry
from resources.settings import PipelineSettings
from resources.state.layout import DataLayout
from resources.state.sidecars import EventTimeWatermark
from resources.state.work_unit_log import new_ranges
from spark_ops.registry_calls import fed_times

SETTINGS = TailSettings.of(PipelineSettings())


@pytest.fixture
def workload(tmp_path):
    data = tmp_path / "data"
    gen.generate(data, gen.GenConfig(queries=400, seed=5, bad_lines=4))
    return DataLayout(data)


@pytest.fixture
def registry(tmp_path):
    engine = ShardedIdRegistry(tmp_path / "registry", gc_interval_seconds=None)
    yield engine
    engine.close()


def valid_query_ids(layout: DataLayout) -> set[str]:
    """The query ids of the complete, well-formed lines the generator wrote (its torn last lines and
    bad lines excluded), read independently of the tailer's parser."""
    ids = set()
    for path in layout.stream_dir("dc1", "query").rglob("*.jsonl"):
        for raw in path.read_bytes().split(b"\n")[:-1]:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if isinstance(event, dict) and isinstance(event.get("query_id"), str) and \
                    isinstance(event.get("timestamp_us"), int) and isinstance(event.get("ads"), list) and \
                    isinstance(event.get("query_text"), str):
                ids.add(event["query_id"])
    return ids


def held(registry, ids) -> set[str]:
    return set(registry.recall_queries("dc1", pa.table({"query_id": sorted(ids)}))["query_id"].to_pylist())


def test_a_poll_holds_every_valid_query_line_and_records_where_it_read_to(workload, registry):
    tailer = QueryTailer(workload, "dc1", registry, SETTINGS)
    done = tailer.poll()
    expected = valid_query_ids(workload)
    assert done.lines_put >= len(expected) > 300
    assert held(registry, expected) == expected
    state = registry.tail_state("dc1")
    # Every complete line read, nothing beyond: no range is left between the offsets and the logs' ends.
    assert new_ranges(workload.stream_dir("dc1", "query"), state["offsets"]) == []
    assert state["part"] == tailer.part >= 1
    times = {}
    for query_id in expected:
        writer, ts = query_id.rsplit(":", 1)
        times[writer] = max(times.get(writer, 0), int(ts))
    assert state["writers"] == times
    # The mirrors the dispatchers read.
    mirror = QueryTail.load(workload.query_tail_file("dc1"))
    assert mirror.fresh() and mirror.offsets == state["offsets"]
    assert {w: p.max_ts for w, p in QueryProgress.load(workload.query_tail_progress_file("dc1")).writers.items()} == times
    assert EventTimeWatermark.load(workload.watermark_file("dc1", "query_tail")).watermark_us is not None


def test_a_poll_keeps_what_it_parsed_for_the_query_runs(workload, registry, tmp_path):
    """Every line it read, valid and bad, in segments that cover exactly the ranges it read."""
    tailer = QueryTailer(workload, "dc1", registry, SETTINGS)
    tailer.poll()
    stream_dir = workload.stream_dir("dc1", "query")
    read = [(f, 0, end) for f, end in registry.tail_state("dc1")["offsets"].items()]
    segments = TailSegments(workload.query_tail_segments_dir("dc1"), SETTINGS.max_line_bytes)
    pieces = segments.covering(read)
    assert pieces is not None and segments.covering([(f, 0, end + 1) for f, _, end in read]) is None
    assert segments.stage(pieces, tmp_path / "staged")
    rows = ds.dataset(str(tmp_path / "staged"), format="parquet").to_table()
    valid = rows.filter(pc.is_null(rows["reason"]))
    assert sorted(valid["query_id"].to_pylist()) == sorted(valid_query_ids(workload))
    assert rows.num_rows > valid.num_rows  # the bad lines too, with their reasons, for the quarantine
    assert rows.num_rows == sum(1 for f, _, end in read for _ in (stream_dir / f).read_bytes()[:end].splitlines())
    assert valid["line"].null_count == valid.num_rows  # staged as a query run stages them: no text


def test_a_restarted_tailer_resumes_where_the_registry_says_and_reads_only_new_lines(workload, registry):
    first = QueryTailer(workload, "dc1", registry, SETTINGS)
    first.poll()
    before = registry.stats()["recent_queries"]["dc1"]["rows"]
    again = QueryTailer(workload, "dc1", registry, SETTINGS)
    assert (again.part, again.offsets) == (first.part, first.offsets)
    assert again.poll().bytes_read == 0
    path = next(workload.stream_dir("dc1", "query").rglob("*.jsonl"))
    writer = "10.9.9.9:4242"
    line = {"query_id": f"{writer}:1763700000000000", "timestamp_us": 1763700000000000, "query_text": "q",
            "ads": [{"ad_id": "a", "advertiser_id": "b", "position": 1, "bid_micros": 5}]}
    with open(path, "ab") as f:
        f.write(json.dumps(line).encode() + b"\n" + b'{"query_id": "torn')
    done = again.poll()
    assert done.lines_put == 1
    assert registry.stats()["recent_queries"]["dc1"]["rows"] == before + 1
    assert registry.tail_state("dc1")["writers"][writer] == 1763700000000000


def test_a_registry_that_holds_nothing_makes_the_tailer_start_over(workload, registry, tmp_path):
    QueryTailer(workload, "dc1", registry, SETTINGS).poll()
    fresh = ShardedIdRegistry(tmp_path / "registry2", gc_interval_seconds=None)
    try:
        tailer = QueryTailer(workload, "dc1", fresh, SETTINGS)
        assert (tailer.part, tailer.offsets) == (0, {})
        assert not workload.query_tail_file("dc1").exists()
        tailer.poll()
        assert held(fresh, valid_query_ids(workload)) == valid_query_ids(workload)
    finally:
        fresh.close()


def test_a_put_larger_than_its_budget_is_cut_at_line_ends(workload, registry, monkeypatch):
    monkeypatch.setattr("photon.query_tail.PUT_BYTES", 10_000)
    tailer = QueryTailer(workload, "dc1", registry, SETTINGS)
    tailer.poll()
    assert tailer.part > 5
    assert held(registry, valid_query_ids(workload)) == valid_query_ids(workload)


def test_fed_times_name_each_querys_writer_time_and_minus_one_for_a_writer_not_seen():
    ids = pa.array(["10.0.0.1:7:100", "10.0.0.2:8:5", "bad"])
    assert fed_times(ids, None).to_pylist() == [None, None, None]
    assert fed_times(ids, {"writers": {"10.0.0.1:7": 90}}).to_pylist() == [90, -1, -1]


def test_a_tailer_ends_with_its_parent_even_when_signalled_twice(workload, tmp_path):
    """A tailer's parent (photon run, photon up) killed with SIGKILL: the kernel sends the tailer
    SIGTERM (photon/supervisor.py starts every child under `setpriv --pdeathsig`), and it exits, with more SIGTERMs on top. Its handler once set the
    Event its loop waited on, and a second signal landing while the first handler held that Event's
    lock deadlocked it: a tailer outlived the fault test that started it. That race is too narrow
    to hit on demand here (this test passed 2 of 3 times against that handler)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from resources.state.layout import REPO_ROOT
    from resources.spark.connect_server import free_port

    port = free_port()
    ready = tmp_path / "ready"
    server = subprocess.Popen([sys.executable, "-m", "photon.cli", "registry", "serve", "--data-dir", str(workload.root),
                               "--port", str(port), "--ready-file", str(ready)], cwd=REPO_ROOT)
    parent = None
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert server.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        script = ("import contextlib, logging, sys, time; from pathlib import Path; "
                  "from photon.components import query_tailers; from photon.supervisor import Supervisor; "
                  "from resources.state.layout import DataLayout; s = Supervisor(logging.getLogger()); held = contextlib.ExitStack(); "
                  "names = held.enter_context(query_tailers(s, DataLayout(Path(sys.argv[1])), ['dc1'], sys.argv[2])); "
                  "print(s.pid(names[0]), flush=True); time.sleep(600)")
        parent = subprocess.Popen([sys.executable, "-c", script, str(workload.root), SETTINGS.to_json()], cwd=REPO_ROOT,
                                  stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "PHOTON_REGISTRY_ADDRESS": f"127.0.0.1:{port}"})
        tailer = int(parent.stdout.readline())
        while not workload.query_tail_file("dc1").exists():  # it is tailing
            assert time.monotonic() < deadline
            time.sleep(0.1)
        parent.kill()
        parent.wait()
        for _ in range(20):  # signals on top of the kernel's: a handler interrupted by the next one
            os.kill(tailer, signal.SIGTERM)
        while Path(f"/proc/{tailer}").exists() and (Path(f"/proc/{tailer}/stat").read_text().split()[2] != "Z"):
            assert time.monotonic() < deadline + 10, "the tailer outlived its parent"
            time.sleep(0.1)
    finally:
        if parent is not None and parent.poll() is None:
            parent.kill()
        server.terminate()
        server.wait(timeout=30)
