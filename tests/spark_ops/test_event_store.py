"""The EventStore's two tiers, the cache's retention, and pending clicks up to unjoinable."""

import json
import time

from pyspark.sql import functions as F

from resources.layout import TABLES
from resources.registry_shards import ShardedIdRegistry
from resources.stream_state import QueryProgress, WriterProgress, pending_retry_decision
from spark_ops.event_store import EventStore, evict_from_cache
from spark_ops.ingest import ingest_queries, line_stats
from spark_ops.join import join_work_unit
from spark_ops.parse import ByteRange, events, parse_ranges
from spark_ops.pending import PendingPolicy
from spark_ops.tables import read_table
from tests.conftest import click, query, write_lines

T0 = 1_700_000_000_000_000
SECOND = 1_000_000


def qid(writer: str, i: int) -> str:
    return f"{writer}:{T0 + i * SECOND}"


NAMES = ["c1", "c2", "c3", "c4", "c5", "c6", "c7", "joins-now", "waits", "stray"]


def cid(name: str) -> str:
    """A click id of the event id form, for a readable name."""
    return f"10.3.0.1:9:{NAMES.index(name)}"


def name(click_id: str) -> str:
    return NAMES[int(click_id.rsplit(":", 1)[1])]


def ingest(spark, query_dir, tables, files: list[str], unit: str, cache_since_us=None, every_bytes=4096):
    ranges = [ByteRange(f, 0, (query_dir / f).stat().st_size) for f in files]
    parsed = parse_ranges(spark, "query", query_dir, ranges).persist()
    stats = line_stats(parsed, by_writer=True)
    ingest_queries(parsed, stats, "dc1", unit, 1, tables, 10, every_bytes, cache_since_us=cache_since_us)
    parsed.unpersist()
    return stats.writers


def store(spark, tables, query_dir, every_bytes=4096) -> EventStore:
    return EventStore(read_table(spark, "query_logs", tables["query_logs"]),
                      read_table(spark, "log_file_map", tables["log_file_map"]), query_dir, 10, every_bytes, 65536)


def clicks_frame(spark, tmp_path, clicks):
    """The clicks as a parsed frame, one row per click (a new file each call: write_lines appends)."""
    directory = tmp_path / "clicks"
    path = write_lines(directory / f"{len(list(directory.glob('*.jsonl'))) if directory.exists() else 0}.jsonl", clicks)
    return events(parse_ranges(spark, "click", directory, [ByteRange(path.name, 0, path.stat().st_size)]))


def test_queries_older_than_the_cache_are_found_through_the_log_file_map(tmp_path, spark):
    query_dir = tmp_path / "query"
    tables = {name: str(tmp_path / "warehouse" / name) for name in TABLES}
    # Writer A: 200 queries, one a second, in one file; writer B rotates after 50 queries.
    write_lines(query_dir / "a" / "0.jsonl", [query(qid("10.1.0.1:7", i), T0 + i * SECOND) for i in range(200)])
    write_lines(query_dir / "b" / "0.jsonl", [query(qid("10.1.0.2:8", i), T0 + i * SECOND) for i in range(50)])
    write_lines(query_dir / "b" / "1.jsonl", [query(qid("10.1.0.2:8", i), T0 + i * SECOND) for i in range(50, 100)])
    # Only the last 50 s of event time stay in the cache tier.
    ingest(spark, query_dir, tables, ["a/0.jsonl", "b/0.jsonl", "b/1.jsonl"], "dc1.query.0", cache_since_us=T0 + 150 * SECOND)
    assert read_table(spark, "query_logs", tables["query_logs"]).count() == 50

    wanted = {"c1": qid("10.1.0.1:7", 5), "c2": qid("10.1.0.1:7", 77), "c3": qid("10.1.0.1:7", 149),
              "c4": qid("10.1.0.1:7", 180), "c5": qid("10.1.0.2:8", 49), "c6": qid("10.1.0.2:8", 60),
              "c7": f"10.1.0.1:7:{T0 + 500 * SECOND + 1}"}
    clicks = clicks_frame(spark, tmp_path, [click(cid(c), q, T0 + 1000 * SECOND) for c, q in wanted.items()])
    event_store = store(spark, tables, query_dir)
    found, not_found = event_store.lookup(clicks)
    matched = {name(r.click_id): r.query.query_id for r in found.collect()}
    assert matched == {c: q for c, q in wanted.items() if c != "c7"}
    assert [name(r.click_id) for r in not_found.collect()] == ["c7"]
    stats = event_store.stats
    assert (stats.cache_hits, stats.logs_hits, stats.not_found) == (1, 5, 1)
    # Each lookup read at most the W = 10 s of log between two map entries, not whole files.
    line = len((query_dir / "a" / "0.jsonl").read_bytes().splitlines()[0]) + 1
    assert stats.logs_ranges_read == 5 and stats.logs_bytes_read <= 5 * 11 * line
    event_store.release()


def test_the_logs_tier_parses_only_lines_that_may_hold_a_wanted_id_and_finds_escaped_ids(tmp_path, spark):
    query_dir = tmp_path / "query"
    tables = {name: str(tmp_path / "warehouse" / name) for name in TABLES}
    lines = [query(qid("10.1.0.1:7", i), T0 + i * SECOND) for i in range(30)]
    # A valid line whose query id is written with JSON escapes: its id is not in the raw bytes.
    escaped = json.dumps(lines[12]).replace(qid("10.1.0.1:7", 12), qid("10.1.0.1:7", 12).replace(":", "\\u003a"))
    assert qid("10.1.0.1:7", 12) not in escaped
    write_lines(query_dir / "a" / "0.jsonl", lines[:12] + [escaped] + lines[13:])
    # Nothing in the cache tier: every lookup goes through the log file map.
    ingest(spark, query_dir, tables, ["a/0.jsonl"], "dc1.query.0", cache_since_us=T0 + 100 * SECOND)
    wanted = {"c1": qid("10.1.0.1:7", 12), "c2": qid("10.1.0.1:7", 15)}
    event_store = store(spark, tables, query_dir)
    found, not_found = event_store.lookup(clicks_frame(spark, tmp_path, [click(cid(c), q, T0) for c, q in wanted.items()]))
    assert {name(r.click_id): r.query.query_id for r in found.collect()} == wanted and not_found.count() == 0
    assert event_store.stats.logs_hits == 2
    event_store.release()


def test_a_miss_newer_than_its_writers_ingested_progress_is_not_read_from_the_logs(tmp_path, spark):
    query_dir = tmp_path / "query"
    tables = {name: str(tmp_path / "warehouse" / name) for name in TABLES}
    lines = [query(qid("10.1.0.1:7", i), T0 + i * SECOND) for i in range(120)]
    write_lines(query_dir / "a" / "0.jsonl", lines[:96])
    # Queries 0-95 ingested, none of them cached: the logs tier serves every lookup.
    progress = ingest(spark, query_dir, tables, ["a/0.jsonl"], "dc1.query.0", cache_since_us=T0 + 1000 * SECOND)
    assert progress == {"10.1.0.1:7": (T0, T0 + 95 * SECOND)}
    # The writer has logged on; the dispatcher has not cut that part yet.
    write_lines(query_dir / "a" / "0.jsonl", lines[96:])
    wanted = {"c1": qid("10.1.0.1:7", 50), "c2": qid("10.1.0.1:7", 97), "c3": qid("10.1.0.2:8", 3)}
    clicks = [click(cid(c), q, T0 + 100 * SECOND) for c, q in wanted.items()]

    # Without the progress, query 97 is found past the ingested part, by reading up to the open
    # range's end from the last map entry.
    blind = store(spark, tables, query_dir)
    found, _ = blind.lookup(clicks_frame(spark, tmp_path, clicks))
    assert {name(r.click_id) for r in found.collect()} == {"c1", "c2"}
    blind.release()

    event_store = EventStore(read_table(spark, "query_logs", tables["query_logs"]),
                             read_table(spark, "log_file_map", tables["log_file_map"]), query_dir, 10, 4096, 65536,
                             ingested_until={writer: ts for writer, (_, ts) in progress.items()})
    found, not_found = event_store.lookup(clicks_frame(spark, tmp_path, clicks))
    assert {name(r.click_id): r.query.query_id for r in found.collect()} == {"c1": wanted["c1"]}
    assert sorted(name(r.click_id) for r in not_found.collect()) == ["c2", "c3"]
    stats = event_store.stats
    # c2's writer has not been ingested up to its query's time, c3's writer not at all.
    assert (stats.logs_hits, stats.not_found, stats.not_ingested_yet, stats.logs_ranges_read) == (1, 2, 2, 1)
    event_store.release()


def test_a_miss_the_cache_tier_would_hold_is_not_read_from_the_logs(tmp_path, spark):
    query_dir = tmp_path / "query"
    tables = {name: str(tmp_path / "warehouse" / name) for name in TABLES}
    # 20 minutes of queries, one every 10 s; the cache tier holds those from minute 10 on.
    write_lines(query_dir / "a" / "0.jsonl", [query(qid("10.1.0.1:7", i), T0 + i * SECOND) for i in range(0, 1200, 10)])
    complete_from = T0 + 600 * SECOND
    progress = ingest(spark, query_dir, tables, ["a/0.jsonl"], "dc1.query.0", cache_since_us=complete_from)
    # c1's query is older than the cache (in the logs), c2's is cached, c3's and c4's were never
    # logged: c3's time is within the cache's slack of its start, c4's well inside.
    wanted = {"c1": qid("10.1.0.1:7", 100), "c2": qid("10.1.0.1:7", 900), "c3": qid("10.1.0.1:7", 605),
              "c4": qid("10.1.0.1:7", 1105)}
    clicks = [click(cid(c), q, T0 + 1200 * SECOND) for c, q in wanted.items()]
    event_store = EventStore(read_table(spark, "query_logs", tables["query_logs"]),
                             read_table(spark, "log_file_map", tables["log_file_map"]), query_dir, 10, 4096, 65536,
                             ingested_until={writer: ts for writer, (_, ts) in progress.items()},
                             cache_complete_from_us=complete_from)
    found, not_found = event_store.lookup(clicks_frame(spark, tmp_path, clicks))
    assert {name(r.click_id) for r in found.collect()} == {"c1", "c2"}
    assert sorted(name(r.click_id) for r in not_found.collect()) == ["c3", "c4"]
    stats = event_store.stats
    # The logs tier read c1's range and c3's, not c4's.
    assert (stats.cache_hits, stats.logs_hits, stats.not_found, stats.logs_ranges_read) == (1, 1, 2, 2)
    event_store.release()


def test_the_cache_tier_is_searched_around_the_times_the_query_ids_name(tmp_path, spark):
    query_dir = tmp_path / "query"
    tables = {name: str(tmp_path / "warehouse" / name) for name in TABLES}
    # An hour of queries, one a minute; one is logged with a timestamp two minutes off its id's. The
    # clicks' query ids span half an hour of it.
    queries = [query(qid("10.1.0.1:7", i), T0 + i * SECOND) for i in range(0, 3600, 60)]
    queries.append(query(qid("10.1.0.1:7", 1801), T0 + 1921 * SECOND))
    write_lines(query_dir / "a" / "0.jsonl", queries)
    ingest(spark, query_dir, tables, ["a/0.jsonl"], "dc1.query.0")
    wanted = {"c1": qid("10.1.0.1:7", 1800), "c2": qid("10.1.0.1:7", 1801), "c3": qid("10.1.0.1:7", 3540)}
    clicks = [click(cid(c), q, T0 + 3600 * SECOND) for c, q in wanted.items()]
    event_store = store(spark, tables, query_dir)
    found, not_found = event_store.lookup(clicks_frame(spark, tmp_path, clicks))
    assert {name(r.click_id): r.query.query_id for r in found.collect()} == wanted and not_found.count() == 0
    assert event_store.stats.cache_hits == 3


def test_the_cache_tier_stays_bounded_while_the_logs_grow(tmp_path, spark):
    query_dir = tmp_path / "query"
    tables = {name: str(tmp_path / "warehouse" / name) for name in TABLES}
    retention = 120 * SECOND
    for batch in range(5):  # from the third batch on, every ingest evicts
        name = f"a/{batch}.jsonl"
        write_lines(query_dir / name, [query(qid("10.1.0.1:7", i), T0 + i * SECOND) for i in range(batch * 60, batch * 60 + 60)])
        newest = T0 + (batch * 60 + 59) * SECOND
        ingest(spark, query_dir, tables, [name], f"dc1.query.{batch}", cache_since_us=newest - retention)
        _, oldest_kept = evict_from_cache(spark, tables["query_logs"], "dc1", newest - retention, vacuum_retain_hours=0)
        cached = read_table(spark, "query_logs", tables["query_logs"])
        assert cached.count() <= 121
        assert cached.agg(F.min("timestamp_us")).first()[0] == oldest_kept >= newest - retention
    # Evicted rows' files are gone from disk, not only from the table's current version.
    live = {p.split("/")[-1] for p in read_table(spark, "query_logs", tables["query_logs"]).inputFiles()}
    on_disk = {p.name for p in (tmp_path / "warehouse" / "query_logs").rglob("*.parquet") if "_delta_log" not in p.parts}
    assert on_disk == live
    # The log file map still indexes everything.
    old = clicks_frame(spark, tmp_path, [click(cid("c1"), qid("10.1.0.1:7", 3), T0)])
    found, _ = store(spark, tables, query_dir).lookup(old)
    assert [r.query.query_id for r in found.collect()] == [qid("10.1.0.1:7", 3)]


def test_a_click_hours_before_its_query_waits_then_joins_and_strays_become_unjoinable(tmp_path, spark):
    query_dir = tmp_path / "query"
    tables = {name: str(tmp_path / "warehouse" / name) for name in TABLES}
    registry = ShardedIdRegistry(tmp_path / "registry", gc_interval_seconds=None)
    late_writer = "10.2.0.1:5"
    write_lines(query_dir / "main" / "0.jsonl", [query(qid("10.1.0.1:7", i), T0 + i * SECOND) for i in range(10)])
    progress_file = tmp_path / "state" / "query_progress.json"
    progress = QueryProgress.merge(progress_file, ingest(spark, query_dir, tables, ["main/0.jsonl"], "dc1.query.0"))
    # The late writer's query is logged at T0 + 3 h; its click was logged 3 hours of event time earlier.
    late_query = qid(late_writer, 3 * 3600)
    clicks = clicks_frame(spark, tmp_path, [
        click(cid("joins-now"), qid("10.1.0.1:7", 4), T0 + 5 * SECOND),
        click(cid("waits"), late_query, T0 + 10 * SECOND),
        click(cid("stray"), f"10.1.0.1:7:{T0 + 4 * SECOND + 500_000}", T0 + 9 * SECOND),  # its writer is past it
    ])

    def policy(at=None, **overrides):
        knobs = {"unjoinable_after_seconds": 86400.0, "min_attempts": 2, "backoff_seconds": 2.0,
                 "backoff_max_seconds": 600.0, **overrides}
        return PendingPolicy(progress=at or progress, **knobs)

    def join(frame, token, pending, retrying=False):
        return join_work_unit(spark, frame, store(spark, tables, query_dir), registry, token, 1, "dc1",
                              tmp_path / "staging" / token, tables, pending, retrying_pending=retrying)

    first = join(clicks, "dc1.click.0", policy())
    assert (first.joined, first.pending) == (1, 2)
    waiting = read_table(spark, "pending_clicks", tables["pending_clicks"])
    digest = policy().digest(spark, tables["pending_clicks"], "dc1")
    assert digest.pending == 2 and digest.retry_at is None and set(digest.needs) == {late_writer, "10.1.0.1:7"}
    # No new query data: no retry is due, now or later.
    assert not pending_retry_decision(digest, progress, 86400).ready
    assert policy().due(waiting, now=time.time() + 3600).count() == 0
    # The stray's writer logs on in order, into a new file: its query cannot be there.
    write_lines(query_dir / "main" / "1.jsonl", [query(qid("10.1.0.1:7", i), T0 + i * SECOND) for i in range(10, 20)])
    progress = QueryProgress.merge(progress_file, ingest(spark, query_dir, tables, ["main/1.jsonl"], "dc1.query.1"))
    assert not pending_retry_decision(digest, progress, 86400).ready
    assert policy().due(waiting, now=time.time() + 3600).count() == 0
    # Lines of that writer behind its progress (a backfill) could hold it: the stray is due.
    main = progress.writers["10.1.0.1:7"]
    backfilled = QueryProgress({**progress.writers, "10.1.0.1:7": WriterProgress(main.max_ts, main.backfills + 1)})
    assert [name(r.click_id) for r in policy(at=backfilled).due(waiting, now=time.time() + 3).collect()] == ["stray"]

    # The late writer's logs arrive, with the click's query three hours of event time later.
    write_lines(query_dir / "late" / "0.jsonl", [query(late_query, T0 + 3 * 3600 * SECOND)])
    progress = QueryProgress.merge(progress_file, ingest(spark, query_dir, tables, ["late/0.jsonl"], "dc1.query.2"))
    assert pending_retry_decision(digest, progress, 86400).ready
    due = policy().due(read_table(spark, "pending_clicks", tables["pending_clicks"]), now=time.time() + 3)
    assert [name(r.click_id) for r in due.collect()] == ["waits"]
    retried = join(due, "dc1.pending.0", policy(), retrying=True)
    assert (retried.joined, retried.pending) == (1, 0)
    left = read_table(spark, "pending_clicks", tables["pending_clicks"]).collect()
    assert [(name(r.click_id), r.attempts) for r in left] == [("stray", 1)]

    # The stray click is now far behind the query stream: one last lookup, then unjoinable.
    aged = policy(unjoinable_after_seconds=3600)
    due = aged.due(read_table(spark, "pending_clicks", tables["pending_clicks"]), now=time.time() + 3)
    final = join(due, "dc1.pending.1", aged, retrying=True)
    assert (final.given_up, final.pending) == (1, 0)
    [row] = read_table(spark, "unjoinable_clicks", tables["unjoinable_clicks"]).collect()
    assert name(row.click_id) == "stray" and row.reason.startswith("query not found in 2 lookups")
    assert read_table(spark, "pending_clicks", tables["pending_clicks"]).count() == 0
    joined = read_table(spark, "joined_clicks", tables["joined_clicks"])
    assert sorted(name(r.click_id) for r in joined.collect()) == ["joins-now", "waits"]
    registry.close()
