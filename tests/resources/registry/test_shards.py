"""The sharded engine: the stable hash, batching inside a registry thread, resharding, GC."""

import hashlib
import threading
import time
from collections import Counter

import duckdb
import pyarrow as pa
import pytest

from resources.registry.shards import US_PER_DAY, ShardedIdRegistry, now_us, shard_of

NOW = now_us()


def events(*ids: str, ts: int = NOW) -> pa.Table:
    return pa.table({"click_id": list(ids), "timestamp_us": pa.array([ts] * len(ids), pa.int64())})


def statuses(table: pa.Table) -> dict[str, str]:
    return dict(zip(table.column("click_id").to_pylist(), table.column("status").to_pylist()))


def per_shard(registry: ShardedIdRegistry) -> dict[int, int]:
    return {s["shard"]: s["ids_registered"] for s in registry.stats()["shards"]}


def wait_for(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def test_fixed_id_maps_to_a_fixed_shard():
    # Pinned values: changing them reroutes every registered id to another shard.
    assert shard_of("10.3.0.1:1:1", 16) == 9
    assert shard_of("click-42", 1000) == 690
    ids = [f"id-{i}" for i in range(200)] + ["", "é✓"]
    con = duckdb.connect()
    con.register("t", pa.table({"click_id": ids}))
    vectorised = [row[0] for row in con.sql("SELECT (md5_number(click_id) % 7)::INTEGER FROM t").fetchall()]
    assert vectorised == [int.from_bytes(hashlib.md5(i.encode()).digest(), "little") % 7 for i in ids]


def test_a_batch_spanning_shards_is_split_by_the_hash(tmp_path):
    registry = ShardedIdRegistry(tmp_path, shards=4, gc_interval_seconds=None)
    ids = [f"c{i}" for i in range(10_000)]
    answer = registry.commit(events(*ids), "unit-1")
    assert answer.num_rows == 10_000 and set(answer.column("status").to_pylist()) == {"held"}
    assert per_shard(registry) == dict(Counter(shard_of(i, 4) for i in ids))
    registry.close()


def test_one_batch_resolves_conflicts_earliest_request_first(tmp_path):
    registry = ShardedIdRegistry(tmp_path, shards=1, gc_interval_seconds=None)
    registry.commit(events("old"), "unit-0")
    requests = [(("a", "b"), "unit-1"), (("b", "c"), "unit-2"), (("a", "c", "d"), "unit-1"),
                (("d", "e", "old"), "unit-3"), (("e",), "unit-2"), (("a", "e"), "unit-3")]
    answers: list = [None] * len(requests)
    before = registry.stats()["total"]
    with registry.paused():
        threads = []
        for n, (ids, token) in enumerate(requests):
            # One at a time, so the queue order is the list order.
            thread = threading.Thread(target=lambda n=n, ids=ids, token=token: answers.__setitem__(
                n, statuses(registry.commit(events(*ids), token))))
            thread.start()
            threads.append(thread)
            wait_for(lambda: registry.stats()["total"]["requests_received"] == before["requests_received"] + n + 1)
    for thread in threads:
        thread.join()
    after = registry.stats()["total"]
    assert after["transactions"] == before["transactions"] + 1  # six requests, one transaction
    assert answers == [
        {"a": "held", "b": "held"},
        {"b": "refused", "c": "held"},
        {"a": "held", "c": "refused", "d": "held"},  # same token as the winner of a
        {"d": "refused", "e": "held", "old": "refused"},
        {"e": "refused"},
        {"a": "refused", "e": "held"},
    ]
    tokens = {r["click_id"]: r["token"] for r in registry.scan().read_all().to_pylist()}
    assert tokens == {"old": "unit-0", "a": "unit-1", "b": "unit-1", "c": "unit-2", "d": "unit-1", "e": "unit-3"}
    registry.close()


def test_resharding_keeps_old_ids_where_they_were_and_survives_restart(tmp_path):
    registry = ShardedIdRegistry(tmp_path, shards=2, max_clock_skew_seconds=0.5, gc_interval_seconds=None)
    with pytest.raises(ValueError, match="earlier than now"):
        registry.reshard(5, effective_at_us=now_us())
    before = [f"old{i}" for i in range(300)]
    registry.commit(events(*before), "unit-1")
    effective = now_us() + 1_000_000
    config = registry.reshard(5, effective_at_us=effective)
    assert config == [{"start_us": 0, "end_us": effective, "shards": 2},
                      {"start_us": effective, "end_us": None, "shards": 5}]
    with pytest.raises(ValueError, match="earlier than the current configuration"):
        registry.reshard(3, effective_at_us=effective - 1)
    after = [f"new{i}" for i in range(300)]
    registry.commit(events(*after, ts=effective), "unit-2")
    registry.close()

    reopened = ShardedIdRegistry(tmp_path, shards=7, gc_interval_seconds=None)  # stored config wins
    assert reopened.configuration() == config
    assert set(statuses(reopened.commit(events(*before), "unit-3")).values()) == {"refused"}
    found = reopened.lookup(events(*before))
    assert found.num_rows == 300 and set(found.column("token").to_pylist()) == {"unit-1"}
    assert set(statuses(reopened.commit(events(*after, ts=effective + 5), "unit-3")).values()) == {"refused"}
    expected = Counter(shard_of(i, 2) for i in before) + Counter(shard_of(i, 5) for i in after)
    assert per_shard(reopened) == {shard: expected[shard] for shard in range(5)}
    reopened.close()


def test_too_old_ids_and_a_gc_boundary_that_never_goes_back(tmp_path):
    registry = ShardedIdRegistry(tmp_path, gc_threshold_days=3, gc_interval_seconds=None)
    newest = NOW - US_PER_DAY  # a replay: event time behind the wall clock
    registry.commit(events("stale", ts=newest - 5 * US_PER_DAY), "unit-1")
    registry.commit(events("fresh", ts=newest), "unit-1")
    result = registry.collect_garbage()
    boundary = newest - 3 * US_PER_DAY  # event time, not wall-clock time, drives the boundary
    assert result == {"boundaries_us": {"0": boundary}, "deleted": {"0": 1}}

    late = events("late", ts=boundary - 1)
    assert statuses(registry.commit(late, "unit-2")) == {"late": "too_old"}
    assert registry.lookup(pa.concat_tables([late, events("fresh", ts=newest)])).sort_by("click_id").to_pylist() == [
        {"click_id": "fresh", "token": "unit-1", "status": "registered"},
        {"click_id": "late", "token": None, "status": "too_old"},
    ]
    assert statuses(registry.commit(events("edge", ts=boundary), "unit-2")) == {"edge": "held"}
    # A bogus future timestamp does not drag the boundary past the wall clock.
    registry.commit(events("future", ts=NOW + 100 * US_PER_DAY), "unit-2")
    capped = registry.collect_garbage()["boundaries_us"]["0"]
    assert boundary < capped <= now_us() - 3 * US_PER_DAY
    registry.close()

    # A longer threshold after restart would move the boundary back; the stored one stays.
    reopened = ShardedIdRegistry(tmp_path, gc_threshold_days=30, gc_interval_seconds=None)
    assert reopened.collect_garbage()["boundaries_us"]["0"] == capped
    assert reopened.stats()["shards"][0]["gc_boundary_us"] == capped
    assert statuses(reopened.commit(late, "unit-2")) == {"late": "too_old"}
    reopened.close()


def test_background_gc_thread_advances_the_boundary(tmp_path):
    registry = ShardedIdRegistry(tmp_path, gc_threshold_days=1, gc_interval_seconds=0.05)
    registry.commit(events("old", ts=NOW - 2 * US_PER_DAY), "unit-1")
    registry.commit(events("new"), "unit-1")
    wait_for(lambda: registry.stats()["total"]["ids_registered"] == 1)
    assert registry.stats()["shards"][0]["gc_boundary_us"] == NOW - US_PER_DAY
    registry.close()


def test_close_answers_every_queued_request(tmp_path):
    registry = ShardedIdRegistry(tmp_path, shards=2, gc_interval_seconds=None)
    answers: list = []
    with registry.paused():
        threads = [threading.Thread(target=lambda n=n: answers.append(registry.commit(events(f"x{n}"), "u")))
                   for n in range(8)]
        for thread in threads:
            thread.start()
        wait_for(lambda: registry.stats()["total"]["requests_received"] == 8)
        closer = threading.Thread(target=registry.close)
        closer.start()
    closer.join()
    for thread in threads:
        thread.join()
    assert len(answers) == 8
    reopened = ShardedIdRegistry(tmp_path, gc_interval_seconds=None)
    assert reopened.stats()["total"]["ids_registered"] == 8
    reopened.close()
