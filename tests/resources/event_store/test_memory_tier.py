"""The EventStore's memory tier (resources/event_store/memory_tier.py): pieces held by work unit, looked up by
query id, giving up their lines by event time and by bytes and leaving by bytes, the horizon that
makes a miss conclusive, and located queries' lines read back from the logs."""

import pyarrow as pa
import pytest

from resources.event_store.memory_tier import PIECE_SCHEMA, Holding, RecentQueries, read_located

SECOND = 1_000_000
NOW = 1_700_000_000 * SECOND


def lines(writer: str, times: list[int], file: str = "q.jsonl") -> pa.Table:
    ids = [f"{writer}:{t}" for t in times]
    text = [f'{{"query_id":"{i}"}}' for i in ids]
    offsets = [sum(len(t) + 1 for t in text[:n]) for n in range(len(text))]
    return pa.table({"query_id": ids, "timestamp_us": times, "line": text, "file": [file] * len(ids),
                     "offset": offsets, "length": [len(t) + 1 for t in text]}, schema=PIECE_SCHEMA)


def wanted(*ids: str) -> pa.Table:
    return pa.table({"query_id": list(ids)})


def held_bytes(*tables: pa.Table) -> int:
    """What the tier holds for these pieces, with their lines."""
    store = RecentQueries()
    for n, table in enumerate(tables):
        put(store, f"u{n}", table)
    return store.stats()["dc1"]["bytes"]


def put(store, unit, table, attempt=1, part=0, before=None, retention=600, budget=1 << 30, dc="dc1"):
    return store.put(dc, unit, attempt, part, table, before, Holding(NOW + 300 * SECOND, retention, budget))


def test_lookups_find_each_held_query_once_and_count_hits_and_misses():
    store = RecentQueries()
    put(store, "u1", lines("10.1.0.1:7", [NOW, NOW + SECOND]))
    put(store, "u2", lines("10.1.0.1:7", [NOW + SECOND, NOW + 2 * SECOND]))  # a duplicate line of a query
    found = store.get("dc1", wanted(f"10.1.0.1:7:{NOW + SECOND}", f"10.1.0.1:7:{NOW + 2 * SECOND}", "10.1.0.1:7:5",
                                    f"10.1.0.1:7:{NOW + SECOND}"))
    assert sorted(found["query_id"].to_pylist()) == [f"10.1.0.1:7:{NOW + SECOND}", f"10.1.0.1:7:{NOW + 2 * SECOND}"]
    assert store.get("dc2", wanted(f"10.1.0.1:7:{NOW}")).num_rows == 0  # held per datacenter
    stats = store.stats()["dc1"]
    assert (stats["hits"], stats["misses"], stats["pieces"], stats["rows"]) == (2, 1, 2, 4)


def test_a_lookup_finds_queries_of_writers_naming_the_same_times_in_any_order_and_piece():
    """The tier searches each piece by the time its ids name: ids of two writers naming one time, put out
    of order across pieces, located or not, are each found, and an id of a held time but another writer
    is not."""
    store = RecentQueries()
    put(store, "u1", lines("10.1.0.1:7", [NOW + 3, NOW + 1, NOW + 2]), part=0)
    put(store, "u1", lines("10.1.0.2:8", [NOW + 2, NOW + 1, NOW + 9]), part=1)
    put(store, "u2", lines("10.1.0.1:7", [NOW + 200 * SECOND]), retention=60)  # the others give up their lines
    asked = [f"10.1.0.2:8:{NOW + 1}", f"10.1.0.1:7:{NOW + 2}", f"10.1.0.2:8:{NOW + 2}", f"10.1.0.3:9:{NOW + 2}",
             f"10.1.0.1:7:{NOW + 3}", f"10.1.0.2:8:{NOW + 9}", f"10.1.0.1:7:{NOW + 9}", "no-time"]
    found = store.get("dc1", wanted(*asked))
    assert sorted(found["query_id"].to_pylist()) == sorted(asked[:3] + [asked[4], asked[5]])
    assert found["line"].null_count == found.num_rows  # located: their pieces gave their lines up
    assert (found["timestamp_us"].to_pylist() ==
            [int(query_id.rsplit(":", 1)[1]) for query_id in found["query_id"].to_pylist()])


def test_a_later_attempt_replaces_its_units_pieces_and_future_queries_are_held_apart():
    store = RecentQueries()
    put(store, "u1", lines("10.1.0.1:7", [NOW]), attempt=1, part=0)
    put(store, "u1", lines("10.1.0.1:7", [NOW + 5]), attempt=1, part=1)
    put(store, "u1", lines("10.1.0.1:7", [NOW + 7, NOW + 3600 * SECOND]), attempt=2, part=0)
    assert store.get("dc1", wanted(f"10.1.0.1:7:{NOW}", f"10.1.0.1:7:{NOW + 5}")).num_rows == 0
    assert store.get("dc1", wanted(f"10.1.0.1:7:{NOW + 7}")).num_rows == 1
    # An hour ahead of the clock (latest valid: now + 300 s): from the future, held, but it moves
    # neither the eviction clock (the piece of NOW + 7 stays, 600 s of retention) nor the horizon.
    assert store.get("dc1", wanted(f"10.1.0.1:7:{NOW + 3600 * SECOND}")).num_rows == 1
    put(store, "u2", lines("10.1.0.1:7", [NOW + 200 * SECOND]))
    assert store.get("dc1", wanted(f"10.1.0.1:7:{NOW + 7}")).num_rows == 1
    assert store.stats()["dc1"]["newest_ts"] == NOW + 200 * SECOND and store.horizon("dc1") == -1
    # Over the byte budget it leaves last, and then the horizon covers it: a miss is no longer conclusive.
    put(store, "u3", lines("10.1.0.2:8", [NOW + 201 * SECOND]), budget=1)
    assert store.stats()["dc1"]["pieces"] == 0 and store.horizon("dc1") == NOW + 3600 * SECOND


def test_pieces_give_up_their_lines_by_event_time_and_bytes_and_leave_by_bytes_raising_the_horizon():
    store = RecentQueries()
    assert store.horizon("dc1") is None  # nothing put since the process started: no miss is conclusive
    put(store, "u1", lines("10.1.0.1:7", [NOW, NOW + 10 * SECOND]), before=NOW - SECOND)
    assert store.horizon("dc1") == NOW - SECOND  # what was ingested before the first piece may be missing
    # Past the retention, a piece gives up its lines but stays: the horizon does not move.
    put(store, "u2", lines("10.1.0.1:7", [NOW + 100 * SECOND]), retention=60)
    stats = store.stats()["dc1"]
    assert (stats["pieces"], stats["located_rows"]) == (2, 2) and store.horizon("dc1") == NOW - SECOND
    assert store.get("dc1", wanted(f"10.1.0.1:7:{NOW}"))["line"].to_pylist() == [None]
    # Over the byte budget, the oldest piece with lines gives them up, whatever its age.
    three = lines("10.1.0.1:7", [NOW + 100 * SECOND]), lines("10.1.0.2:8", [NOW + 101 * SECOND])
    budget = store.stats()["dc1"]["bytes"] + held_bytes(three[1]) - 1
    put(store, "u3", three[1], budget=budget)
    stats = store.stats()["dc1"]
    assert (stats["pieces"], stats["located_rows"]) == (3, 3) and store.horizon("dc1") == NOW - SECOND
    located = store.get("dc1", wanted(f"10.1.0.1:7:{NOW + 100 * SECOND}"))
    assert located["line"].to_pylist() == [None] and located["file"].to_pylist() == ["q.jsonl"]
    assert store.get("dc1", wanted(f"10.1.0.2:8:{NOW + 101 * SECOND}"))["line"].null_count == 0
    # Still over it once every piece is located: the oldest leave, and the horizon covers them.
    put(store, "u4", lines("10.1.0.2:8", [NOW + 102 * SECOND]), budget=1)
    assert store.stats()["dc1"]["pieces"] == 0 and store.horizon("dc1") == NOW + 102 * SECOND


def test_a_located_querys_line_is_read_from_the_log_and_a_rewritten_log_is_an_error(tmp_path):
    held = lines("10.1.0.1:7", [NOW, NOW + SECOND, NOW + 2 * SECOND])
    (tmp_path / "q.jsonl").write_text("".join(t + "\n" for t in held["line"].to_pylist()))
    store = RecentQueries()
    put(store, "u1", held.slice(0, 2))
    put(store, "u2", held.slice(2), budget=held_bytes(held.slice(0, 2), held.slice(2)) - 1)  # u1 is located now
    recalled = store.get("dc1", wanted(*held["query_id"].to_pylist()))
    assert recalled["line"].null_count == 2
    assert sorted(read_located(recalled, tmp_path, 1000)["line"].to_pylist()) == sorted(held["line"].to_pylist())
    (tmp_path / "q.jsonl").write_text("x" * 200)
    with pytest.raises(ValueError, match="rewritten"):
        read_located(recalled, tmp_path, 1000)


def test_a_tailers_puts_add_up_where_it_read_each_file_to():
    """Each put names the files it read; the tier keeps every file's latest, and hands them out only
    when asked (a click lookup wants the writers' times alone)."""
    store = RecentQueries()
    holding = Holding(NOW + 300 * SECOND, 600, 1 << 30)
    store.put_tailed("dc1", lines("10.1.0.1:7", [NOW]), {"part": 1, "offsets": {"a.jsonl": 10, "b.jsonl": 5},
                                                        "writers": {"10.1.0.1:7": NOW}}, holding)
    store.put_tailed("dc1", lines("10.1.0.1:7", [NOW + 1]), {"part": 2, "offsets": {"b.jsonl": 9},
                                                            "writers": {"10.1.0.1:7": NOW + 1}}, holding)
    assert store.tail_state("dc1") == {"part": 2, "offsets": {"a.jsonl": 10, "b.jsonl": 9},
                                       "writers": {"10.1.0.1:7": NOW + 1}}
    assert store.tail_state("dc1", offsets=False) == {"part": 2, "writers": {"10.1.0.1:7": NOW + 1}}
    assert store.tail_state("dc2") is None
