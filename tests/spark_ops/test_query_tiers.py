"""The EventStore's tiers beyond memory (the durable tier and the logs tier), the durable tier's
retention, the memory tier's conclusive misses, and pending clicks up to unjoinable."""

import json
import time

from pyspark.sql import functions as F

from resources.event_store.memory_tier import Holding
from resources.event_store.progress import QueryProgress, WriterProgress
from resources.registry.shards import ShardedIdRegistry
from resources.state.layout import TABLES
from spark_ops.query_tiers import DurableTiers, EventStore, evict_from_cache
from spark_ops.ingest import UnitOutput, ingest_queries, line_stats, stage_queries
from spark_ops.join import ClickPass, JoinInput, join_work_unit
from spark_ops.parse import ByteRange, events, parse_ranges
from spark_ops.pending import PendingPolicy, compact_pending, pending_of, pending_retry_decision
from spark_ops.registry_calls import QueryPut
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


def ingest(spark, query_dir, tables, files: list[str], unit: str, cache_since_us=None, every_bytes=4096,
           registry=None, ingested_before_ts=None, memory_bytes=1 << 30):
    """A query work unit's ingest; its lines go to `registry`'s memory tier (a registry of its own by
    default, which no lookup asks: the tests of the tiers beyond memory)."""
    ranges = [ByteRange(f, 0, (query_dir / f).stat().st_size) for f in files]
    own = registry is None
    registry = registry or ShardedIdRegistry(query_dir.parent / "unused-registry" / unit, gc_interval_seconds=None)
    staged = query_dir.parent / "staging" / unit
    try:
        parsed, _ = stage_queries(spark, query_dir, ranges, 65536,
                                  QueryPut(registry, "dc1", unit, 1, ingested_before_ts, Holding(10**17, 3600, memory_bytes)),
                                  staged)
        stats = line_stats(staged, by_writer=True)
        ingest_queries(parsed, staged, stats, UnitOutput("dc1", unit, 1, tables), 10, every_bytes, cache_since_us=cache_since_us)
    finally:
        if own:
            registry.close()
    return stats.writers


def beyond(event_store: EventStore, clicks) -> dict[str, str]:
    """{click name: query id} the durable and logs tiers find for the clicks."""
    lines = event_store.beyond_memory(clicks.select("click_id", "query_id")).collect()
    return {name(r.click_id): json.loads(r.line)["query_id"] for r in lines}


def store(spark, tables, query_dir, every_bytes=4096) -> EventStore:
    return EventStore(lambda: DurableTiers(read_table(spark, "query_logs", tables["query_logs"]),
                                           read_table(spark, "log_file_map", tables["log_file_map"])),
                      query_dir, 10, every_bytes, 65536)


def clicks_frame(spark, tmp_path, clicks):
    """The clicks as a parsed frame, one row per click (a new file each call: write_lines appends)."""
    directory = tmp_path / "clicks"
    path = write_lines(directory / f"{len(list(directory.glob('*.jsonl'))) if directory.exists() else 0}.jsonl", clicks)
    return events(parse_ranges(spark, "click", directory, [ByteRange(path.name, 0, path.stat().st_size)]))


def test_queries_older_than_the_durable_tier_are_found_through_the_log_file_map(tmp_path, spark):
    query_dir = tmp_path / "query"
    tables = {name: str(tmp_path / "warehouse" / name) for name in TABLES}
    # Writer A: 200 queries, one a second, in one file; writer B rotates after 50 queries.
    write_lines(query_dir / "a" / "0.jsonl", [query(qid("10.1.0.1:7", i), T0 + i * SECOND) for i in range(200)])
    write_lines(query_dir / "b" / "0.jsonl", [query(qid("10.1.0.2:8", i), T0 + i * SECOND) for i in range(50)])
    write_lines(query_dir / "b" / "1.jsonl", [query(qid("10.1.0.2:8", i), T0 + i * SECOND) for i in range(50, 100)])
    # Only the last 50 s of event time stay in the durable tier.
    ingest(spark, query_dir, tables, ["a/0.jsonl", "b/0.jsonl", "b/1.jsonl"], "dc1.query.0", cache_since_us=T0 + 150 * SECOND)
    assert read_table(spark, "query_logs", tables["query_logs"]).count() == 50

    wanted = {"c1": qid("10.1.0.1:7", 5), "c2": qid("10.1.0.1:7", 77), "c3": qid("10.1.0.1:7", 149),
              "c4": qid("10.1.0.1:7", 180), "c5": qid("10.1.0.2:8", 49), "c6": qid("10.1.0.2:8", 60),
              "c7": f"10.1.0.1:7:{T0 + 500 * SECOND + 1}"}
    clicks = clicks_frame(spark, tmp_path, [click(cid(c), q, T0 + 1000 * SECOND) for c, q in wanted.items()])
    event_store = store(spark, tables, query_dir)
    assert beyond(event_store, clicks) == {c: q for c, q in wanted.items() if c != "c7"}
    stats = event_store.stats
    assert (stats.durable_hits, stats.logs_hits) == (1, 5)
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
    # Nothing in the durable tier: every lookup goes through the log file map.
    ingest(spark, query_dir, tables, ["a/0.jsonl"], "dc1.query.0", cache_since_us=T0 + 100 * SECOND)
    wanted = {"c1": qid("10.1.0.1:7", 12), "c2": qid("10.1.0.1:7", 15)}
    event_store = store(spark, tables, query_dir)
    assert beyond(event_store, clicks_frame(spark, tmp_path, [click(cid(c), q, T0) for c, q in wanted.items()])) == wanted
    assert event_store.stats.logs_hits == 2
    event_store.release()


def test_a_miss_the_durable_tier_would_hold_is_not_read_from_the_logs(tmp_path, spark):
    query_dir = tmp_path / "query"
    tables = {name: str(tmp_path / "warehouse" / name) for name in TABLES}
    # 20 minutes of queries, one every 10 s; the durable tier holds those from minute 10 on.
    write_lines(query_dir / "a" / "0.jsonl", [query(qid("10.1.0.1:7", i), T0 + i * SECOND) for i in range(0, 1200, 10)])
    complete_from = T0 + 600 * SECOND
    ingest(spark, query_dir, tables, ["a/0.jsonl"], "dc1.query.0", cache_since_us=complete_from)
    # c1's query is older than the durable tier (in the logs), c2's is there, c3's and c4's were
    # never logged: c3's time is within the tier's slack of its start, c4's well inside.
    wanted = {"c1": qid("10.1.0.1:7", 100), "c2": qid("10.1.0.1:7", 900), "c3": qid("10.1.0.1:7", 605),
              "c4": qid("10.1.0.1:7", 1105)}
    clicks = [click(cid(c), q, T0 + 1200 * SECOND) for c, q in wanted.items()]
    event_store = EventStore(lambda: DurableTiers(read_table(spark, "query_logs", tables["query_logs"]),
                                                  read_table(spark, "log_file_map", tables["log_file_map"]),
                                                  durable_complete_from_us=complete_from),
                             query_dir, 10, 4096, 65536)
    assert set(beyond(event_store, clicks_frame(spark, tmp_path, clicks))) == {"c1", "c2"}
    stats = event_store.stats
    # The logs tier read c1's range and c3's, not c4's.
    assert (stats.durable_hits, stats.logs_hits, stats.logs_ranges_read) == (1, 1, 2)
    event_store.release()


def test_the_durable_tier_is_searched_around_the_times_the_query_ids_name(tmp_path, spark):
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
    assert beyond(event_store, clicks_frame(spark, tmp_path, clicks)) == wanted
    assert event_store.stats.durable_hits == 3
    event_store.release()


def test_the_durable_tier_stays_bounded_while_the_logs_grow(tmp_path, spark):
    query_dir = tmp_path / "query"
    tables = {name: str(tmp_path / "warehouse" / name) for name in TABLES}
    retention = 120 * SECOND
    for batch in range(5):  # from the third batch on, every ingest evicts
        name = f"a/{batch}.jsonl"
        write_lines(query_dir / name, [query(qid("10.1.0.1:7", i), T0 + i * SECOND) for i in range(batch * 60, batch * 60 + 60)])
        newest = T0 + (batch * 60 + 59) * SECOND
        ingest(spark, query_dir, tables, [name], f"dc1.query.{batch}", cache_since_us=newest - retention)
        _, oldest_kept = evict_from_cache(spark, tables["query_logs"], "dc1", newest - retention)
        cached = read_table(spark, "query_logs", tables["query_logs"])
        assert cached.count() <= 121
        assert cached.agg(F.min("timestamp_us")).first()[0] == oldest_kept >= newest - retention
    # The log file map still indexes everything.
    old = clicks_frame(spark, tmp_path, [click(cid("c1"), qid("10.1.0.1:7", 3), T0)])
    assert beyond(store(spark, tables, query_dir), old) == {"c1": qid("10.1.0.1:7", 3)}


def test_the_memory_tier_answers_and_its_misses_are_conclusive_up_to_its_horizon(tmp_path, spark):
    """A click whose query the memory tier holds is found with no table read; one whose query id names
    a time past the tier's horizon, of a writer ingested past it, is not read for (the query was
    never logged); once its time is below the horizon (an eviction by bytes), the durable and logs
    tiers are asked; a writer not ingested up to the query's time is not read for either."""
    query_dir = tmp_path / "query"
    tables = {name: str(tmp_path / "warehouse" / name) for name in TABLES}
    registry = ShardedIdRegistry(tmp_path / "registry", gc_interval_seconds=None)
    write_lines(query_dir / "a" / "0.jsonl", [query(qid("10.1.0.1:7", i), T0 + i * SECOND) for i in range(0, 100)])
    writers = ingest(spark, query_dir, tables, ["a/0.jsonl"], "dc1.query.0", registry=registry)
    progress = QueryProgress({w: WriterProgress(ts) for w, (_, ts) in writers.items()})
    pending = PendingPolicy(progress, 86400.0, 2, 2.0, 600.0)
    clicks = [click(cid("c1"), qid("10.1.0.1:7", 40), T0 + 50 * SECOND),
              click(cid("stray"), f"10.1.0.1:7:{T0 + 40 * SECOND + 500_000}", T0 + 50 * SECOND),
              click(cid("waits"), qid("10.1.0.1:7", 150), T0 + 150 * SECOND)]

    def join(token, names):
        frame = clicks_frame(spark, tmp_path, [c for c in clicks if name(c["click_id"]) in names])
        return join_work_unit(ClickPass(spark, registry, store(spark, tables, query_dir), pending, token, 1, "dc1",
                                        tmp_path / "staging" / token, tables), JoinInput(frame))

    first = join("dc1.click.0", {"c1", "stray", "waits"})
    assert (first.memory_hits, first.joined, first.pending, first.not_ingested_yet) == (1, 1, 2, 1)
    assert (first.durable_hits, first.logs_hits, first.logs_ranges_read) == (0, 0, 0)
    # A newer piece past the byte budget evicts every piece: their queries are no longer conclusive.
    # (By event time alone the first would only give up its lines, and stay conclusive.)
    write_lines(query_dir / "a" / "1.jsonl", [query(qid("10.1.0.1:7", 5000), T0 + 5000 * SECOND)])
    ingest(spark, query_dir, tables, ["a/1.jsonl"], "dc1.query.1", registry=registry, memory_bytes=1)
    assert registry.queries_horizon("dc1") == T0 + 5000 * SECOND
    again = join("dc1.click.1", {"stray"})
    assert (again.memory_hits, again.durable_hits, again.pending, again.logs_ranges_read) == (0, 0, 1, 1)
    registry.close()


def test_queries_the_memory_tier_holds_located_only_are_joined_from_their_log_lines(tmp_path, spark):
    """Over its bytes, the memory tier keeps the oldest queries by where they lie: the lookup's task
    reads their lines from the logs, and neither the durable nor the logs tier is searched."""
    query_dir = tmp_path / "query"
    tables = {name: str(tmp_path / "warehouse" / name) for name in TABLES}
    registry = ShardedIdRegistry(tmp_path / "registry", gc_interval_seconds=None)
    write_lines(query_dir / "a" / "0.jsonl", [query(qid("10.1.0.1:7", i), T0 + i * SECOND) for i in range(0, 100)])
    write_lines(query_dir / "a" / "1.jsonl", [query(qid("10.1.0.1:7", 100), T0 + 100 * SECOND)])
    writers = ingest(spark, query_dir, tables, ["a/0.jsonl"], "dc1.query.0", registry=registry)
    lined = registry.counters()["recent_queries"]["dc1"]["bytes"]
    writers.update(ingest(spark, query_dir, tables, ["a/1.jsonl"], "dc1.query.1", registry=registry,
                          memory_bytes=lined // 2))
    memory = registry.counters()["recent_queries"]["dc1"]
    assert (memory["located_rows"], memory["evicted_rows"]) == (100, 0)
    progress = QueryProgress({w: WriterProgress(ts) for w, (_, ts) in writers.items()})
    frame = clicks_frame(spark, tmp_path, [click(cid("c1"), qid("10.1.0.1:7", 40), T0 + 50 * SECOND),
                                           click(cid("c2"), qid("10.1.0.1:7", 100), T0 + 101 * SECOND)])
    stats = join_work_unit(ClickPass(spark, registry, store(spark, tables, query_dir),
                                     PendingPolicy(progress, 86400.0, 2, 2.0, 600.0), "dc1.click.0", 1, "dc1",
                                     tmp_path / "staging", tables), JoinInput(frame))
    assert (stats.memory_hits, stats.joined, stats.beyond_memory, stats.durable_hits) == (2, 2, 0, 0)
    joined = {r.click_id: r.query.query_id for r in read_table(spark, "joined_clicks", tables["joined_clicks"]).collect()}
    assert joined == {cid("c1"): qid("10.1.0.1:7", 40), cid("c2"): qid("10.1.0.1:7", 100)}
    registry.close()


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
    pending_path = tables["pending_clicks"]

    def policy(at=None, **overrides):
        knobs = {"unjoinable_after_seconds": 86400.0, "min_attempts": 2, "backoff_seconds": 2.0,
                 "backoff_max_seconds": 600.0, **overrides}
        return PendingPolicy(progress=at or progress, **knobs)

    def join(work, token, pending):
        return join_work_unit(ClickPass(spark, registry, store(spark, tables, query_dir), pending, token, 1, "dc1",
                                        tmp_path / "staging" / token, tables), work)

    first = join(JoinInput(clicks), "dc1.click.0", policy())
    assert (first.joined, first.pending) == (1, 2)
    digest = policy().digest(pending_path, "dc1")
    assert digest.pending == 2 and digest.retry_at is None and set(digest.needs) == {late_writer, "10.1.0.1:7"}
    # No new query data: no retry is due, now or later.
    assert not pending_retry_decision(digest, progress, 86400).ready
    staged = iter(tmp_path / "staging" / f"due{n}" for n in range(10))

    def due(at, **when):
        return at.due(spark, pending_path, "dc1", next(staged), **when)

    assert due(policy(), now=time.time() + 3600) is None
    # The stray's writer logs on in order, into a new file: its query cannot be there.
    write_lines(query_dir / "main" / "1.jsonl", [query(qid("10.1.0.1:7", i), T0 + i * SECOND) for i in range(10, 20)])
    progress = QueryProgress.merge(progress_file, ingest(spark, query_dir, tables, ["main/1.jsonl"], "dc1.query.1"))
    assert not pending_retry_decision(digest, progress, 86400).ready
    assert due(policy(), now=time.time() + 3600) is None
    # Lines of that writer behind its progress (a backfill) could hold it: the stray is due.
    main = progress.writers["10.1.0.1:7"]
    backfilled = QueryProgress({**progress.writers, "10.1.0.1:7": WriterProgress(main.max_ts, main.backfills + 1)})
    assert [name(r.click_id) for r in due(policy(at=backfilled), now=time.time() + 3).collect()] == ["stray"]

    # The late writer's logs arrive, with the click's query three hours of event time later.
    write_lines(query_dir / "late" / "0.jsonl", [query(late_query, T0 + 3 * 3600 * SECOND)])
    progress = QueryProgress.merge(progress_file, ingest(spark, query_dir, tables, ["late/0.jsonl"], "dc1.query.2"))
    assert pending_retry_decision(digest, progress, 86400).ready
    waits = due(policy(), now=time.time() + 3)
    assert [name(r.click_id) for r in waits.collect()] == ["waits"]
    retried = join(JoinInput(None, waits), "dc1.pending.0", policy())
    assert (retried.joined, retried.pending) == (1, 0)
    left = pending_of(spark, pending_path, "dc1").collect()
    assert [(name(r.click_id), r.attempts) for r in left] == [("stray", 1)]
    # Table maintenance rewrites the records down to the current one; the stray goes on from there.
    before, after = compact_pending(spark, pending_path, "dc1")
    assert before > after == 1
    assert [(name(r.click_id), r.attempts) for r in pending_of(spark, pending_path, "dc1").collect()] == [("stray", 1)]

    # The stray click is now far behind the query stream: one last lookup, then unjoinable.
    aged = policy(unjoinable_after_seconds=3600)
    final = join(JoinInput(None, due(aged, now=time.time() + 3)), "dc1.pending.1", aged)
    assert (final.given_up, final.pending) == (1, 0)
    [row] = read_table(spark, "unjoinable_clicks", tables["unjoinable_clicks"]).collect()
    assert name(row.click_id) == "stray" and row.reason.startswith("query not found in 2 lookups")
    assert pending_of(spark, pending_path, "dc1").count() == 0
    joined = read_table(spark, "joined_clicks", tables["joined_clicks"])
    assert sorted(name(r.click_id) for r in joined.collect()) == ["joins-now", "waits"]
    registry.close()
