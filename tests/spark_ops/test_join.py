"""The joiner's exactly-once guarantees, on real Spark, Delta and DuckDB, at each crash point."""

import time
from functools import partial

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from resources.event_store.memory_tier import PIECE_SCHEMA, Holding
from resources.event_store.progress import QueryProgress, WriterProgress
from resources.registry.shards import ShardedIdRegistry
from resources.state.layout import TABLES
from spark_ops.query_tiers import DurableTiers, EventStore
from spark_ops.ingest import UnitOutput, ingest_queries, line_stats, stage_lines, stage_queries
from spark_ops.join import CAPPED_REASON, CRASH_POINTS, ClickPass, JoinInput, join_work_unit, window_advice
from spark_ops.parse import ByteRange, events, parse_ranges
from spark_ops.pending import PendingPolicy, pending_retry_decision
from spark_ops.registry_calls import QueryPut
from spark_ops.tables import read_table
from spark_ops.validity import BEFORE_QUERY_REASON, FUTURE_REASON, TimestampValidity
from tests.conftest import click, query, write_lines

QUERIES = [query(f"10.1.0.1:7:{1000 + i}", 1000 + i) for i in range(6)]
# c0..c5 belong to the queries above; c6 is a duplicate line of c0; c7 and c8 wait for queries
# that have not arrived; c9 belongs to advertiser adv2.
CLICKS = [click(f"10.3.0.1:9:{2000 + i}", f"10.1.0.1:7:{1000 + i}", 2000 + i) for i in range(6)]
CLICKS += [CLICKS[0], click("10.3.0.1:9:2007", "10.1.0.1:8:1", 2007), click("10.3.0.1:9:2008", "10.1.0.1:8:2", 2008)]
CLICKS += [click("10.3.0.1:9:2009", "10.1.0.1:7:1005", 2009, advertiser="adv2")]
JOINABLE = {c["click_id"] for c in CLICKS if c["query_id"].startswith("10.1.0.1:7:")}


class Crash(RuntimeError):
    pass


@pytest.fixture
def world(tmp_path, spark):
    logs = tmp_path / "logs" / "dc1"
    qfile = write_lines(logs / "query" / "w" / "0.jsonl", QUERIES)
    cfile = write_lines(logs / "click" / "w" / "0.jsonl", CLICKS)
    tables = {name: str(tmp_path / "warehouse" / name) for name in TABLES}
    registry = ShardedIdRegistry(tmp_path / "registry", gc_interval_seconds=None)
    staged = tmp_path / "staging" / "q"
    parsed, _ = stage_queries(spark, logs / "query", [ByteRange("w/0.jsonl", 0, qfile.stat().st_size)], 65536,
                              QueryPut(registry, "dc1", "dc1.query.0", 1, None, Holding(10**16, 3600, 1 << 30)), staged)
    stats = line_stats(staged, by_writer=True)
    ingest_queries(parsed, staged, stats, UnitOutput("dc1", "dc1.query.0", 1, tables), 10, 1 << 20)
    progress = QueryProgress({w: WriterProgress(ts) for w, (_, ts) in stats.writers.items()})
    clicks = events(parse_ranges(spark, "click", logs / "click", [ByteRange("w/0.jsonl", 0, cfile.stat().st_size)]))
    yield {"spark": spark, "tables": tables, "clicks": clicks, "registry": registry, "tmp": tmp_path,
           "query_dir": logs / "query", "progress": progress}
    registry.close()


def event_store(world) -> EventStore:
    spark, tables = world["spark"], world["tables"]
    return EventStore(
        lambda: DurableTiers(read_table(spark, "query_logs", tables["query_logs"]),
                             read_table(spark, "log_file_map", tables["log_file_map"])),
        world["query_dir"], 10, 1 << 20, 65536,
    )


def policy(world, **overrides) -> PendingPolicy:
    knobs = {"unjoinable_after_seconds": 86400.0, "min_attempts": 2, "backoff_seconds": 2.0, "backoff_max_seconds": 600.0}
    return PendingPolicy(progress=world["progress"], **{**knobs, **overrides})


def run(world, token="dc1.click.0", dc="dc1", registry=None, checkpoint=lambda point: None, pending=None, attempt=1,
        **kwargs):
    unit = ClickPass(world["spark"], registry or world["registry"], event_store(world), pending or policy(world), token,
                     attempt, dc, world["tmp"] / "staging" / token, world["tables"], checkpoint=checkpoint, **kwargs)
    return join_work_unit(unit, JoinInput(world["clicks"]))


def joined_ids(world) -> list[str]:
    rows = read_table(world["spark"], "joined_clicks", world["tables"]["joined_clicks"]).select("click_id").collect()
    return sorted(r.click_id for r in rows)


def test_clean_run_joins_each_click_once(world):
    stats = run(world)
    assert joined_ids(world) == sorted(JOINABLE)
    assert (stats.looked_up, stats.joined, stats.pending, stats.refused) == (9, 7, 2, 0)
    row = read_table(world["spark"], "joined_clicks", world["tables"]["joined_clicks"]).where(
        F.col("click_id") == "10.3.0.1:9:2003").first()
    assert row.query.query_id == "10.1.0.1:7:1003" and row.query.ads[0].bid_micros == 500
    assert row.joined_by_dc == "dc1" and row.work_unit == "dc1.click.0"
    assert world["registry"].stats()["total"]["ids_with_token"] == 0  # output durable: tokens cleared
    # Window advice: every click came 1000-1004 us after its query.
    assert stats.delay_seconds == {"p50": 0.001, "p99": 0.001, "max": 0.001}


def test_window_advice_compares_the_delays_with_the_join_window():
    assert window_advice({}, 86400) is None
    assert window_advice({"p50": 20.0, "p99": 900.0, "max": 1800.0}, 86400) == (
        "p99 delay 900 s is 1.0% of the 24 h join window: it could be cut to 1 h (twice the largest delay, 1800 s)")
    assert window_advice({"p50": 20.0, "p99": 3000.0, "max": 3500.0}, 3600) == (
        "p99 delay 3000 s is 83.3% of the 1 h join window: the largest delay, 3500 s, is over half of it; "
        "keep it or widen it")


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_crash_then_retry_equals_a_clean_run(world, point):
    def crash(at):
        if at == point:
            raise Crash(at)

    with pytest.raises(Crash):
        run(world, checkpoint=crash)
    retried = run(world, attempt=2)
    assert joined_ids(world) == sorted(JOINABLE)
    assert retried.refused == 0
    total = world["registry"].stats()["total"]
    assert (total["ids_registered"], total["ids_with_token"]) == (7, 0)
    # Once more, as a restart from old offsets would: nothing changes.
    again = run(world, attempt=3)
    assert joined_ids(world) == sorted(JOINABLE) and again.joined == 0 and again.skipped_registered == 7


def test_the_registry_commit_waits_for_the_ledger_append_beside_the_join_and_fails_with_it(world):
    """The click ledger's append runs beside the join (JoinInput.record): no id is registered, and
    no output written, before it commits (recovery re-injects a lost id from its ledger row), and
    when it fails the join fails with its error, leaving a retryable state."""
    spark, tables, registry = world["spark"], world["tables"], world["registry"]
    ledger = UnitOutput("dc1", "dc1.click.0", 1, tables)
    seen = []

    def slow_then_failing_append():
        time.sleep(2)  # longer than building the lookup's plan takes here: the commit must wait
        seen.append(registry.stats()["total"]["ids_registered"])
        raise Crash("ledger append")

    def unit(attempt):
        return ClickPass(spark, registry, event_store(world), policy(world), "dc1.click.0", attempt, "dc1",
                         world["tmp"] / "staging" / "dc1.click.0", tables)

    with pytest.raises(Crash, match="ledger append"):
        join_work_unit(unit(1), JoinInput(world["clicks"], record=slow_then_failing_append))
    assert seen == [0] and registry.stats()["total"]["ids_registered"] == 0
    assert read_table(spark, "joined_clicks", tables["joined_clicks"]).count() == 0

    committed = partial(ledger.append, ledger.with_unit(world["clicks"]), "click_ledger")
    retried = join_work_unit(unit(2), JoinInput(world["clicks"], record=committed))
    assert joined_ids(world) == sorted(JOINABLE) and retried.refused == 0
    assert read_table(spark, "click_ledger", tables["click_ledger"]).count() == len(CLICKS)


def test_another_work_unit_is_skipped_by_lookup_and_refused_by_commit(world):
    run(world)
    other = run(world, token="dc2.click.0", dc="dc2")
    assert (other.skipped_registered, other.joined) == (7, 0)

    class StaleLookup:
        """The registry, but its lookup answered before the other datacenter committed."""

        def __init__(self, registry):
            self.registry = registry

        def __getattr__(self, name):
            return getattr(self.registry, name)

        def lookup(self, ids):
            empty = pa.array([], pa.string())
            return pa.table({"click_id": empty, "token": empty, "status": empty})

    wasted = run(world, token="dc2.click.1", dc="dc2", registry=StaleLookup(world["registry"]))
    assert (wasted.joined, wasted.refused) == (0, 7)
    assert joined_ids(world) == sorted(JOINABLE)


def test_adapter_drops_become_unjoinable_exactly_once(world):
    def no_adv2(pairs):
        return pairs.where(F.col("advertiser_id") != "adv2")

    stats = run(world, adapter=no_adv2)
    assert stats.dropped_by_adapter == 1 and stats.joined == 6
    run(world, token="dc2.click.0", dc="dc2", adapter=no_adv2)
    unjoinable = read_table(world["spark"], "unjoinable_clicks", world["tables"]["unjoinable_clicks"]).collect()
    assert [(r.click_id, r.reason) for r in unjoinable] == [("10.3.0.1:9:2009", "dropped by adapter")]
    assert "10.3.0.1:9:2009" not in joined_ids(world)


def test_absurd_timestamps_are_unjoinable_at_once_and_alike_in_every_attempt(world):
    """Timestamp validity (spark_ops/validity.py): a click from the future and a click before its
    query are resolved as unjoinable with their reason, not left pending; a retry judges alike."""
    spark, tmp = world["spark"], world["tmp"]
    lines = [
        click("10.3.0.2:1:1", "10.1.0.1:7:1001", 1001 - 500),  # 500 us before its query
        click("10.3.0.2:1:2", "10.1.0.1:8:404", 10**15),  # far ahead of the clock below
        click("10.3.0.2:1:3", "10.1.0.1:7:1002", 1002 + 50),  # valid
    ]
    path = write_lines(tmp / "logs" / "dc1" / "click" / "w" / "absurd.jsonl", lines)
    clicks = events(parse_ranges(spark, "click", tmp / "logs" / "dc1" / "click", [ByteRange("w/absurd.jsonl", 0, path.stat().st_size)]))
    validity = TimestampValidity(clock_us=5000, future_tolerance_us=1000, before_query_tolerance_us=100)

    def attempt(n, checkpoint=lambda point: None):
        return join_work_unit(ClickPass(spark, world["registry"], event_store(world), policy(world), "dc1.click.9", n,
                                        "dc1", tmp / "staging" / f"absurd{n}", world["tables"], checkpoint=checkpoint,
                                        validity=validity), JoinInput(clicks))

    def crash(point):
        if point == "after_output_write":
            raise Crash(point)

    with pytest.raises(Crash):
        attempt(1, crash)
    stats = attempt(2)
    assert (stats.joined, stats.invalid_timestamp, stats.pending) == (1, 2, 0)
    unjoinable = read_table(spark, "unjoinable_clicks", world["tables"]["unjoinable_clicks"]).collect()
    assert sorted((r.click_id, r.reason) for r in unjoinable) == [
        ("10.3.0.2:1:1", BEFORE_QUERY_REASON), ("10.3.0.2:1:2", FUTURE_REASON)]
    assert joined_ids(world) == ["10.3.0.2:1:3"]
    assert world["registry"].stats()["total"]["ids_registered"] == 3


def test_future_events_move_no_progress(world):
    spark, tmp = world["spark"], world["tmp"]
    path = write_lines(tmp / "logs" / "dc1" / "query" / "w" / "future.jsonl",
                       [query("10.1.0.9:1:1", 3000), query("10.1.0.9:1:2", 10**15), query("10.1.0.8:1:1", 10**15)])
    stage_lines(spark, "query", tmp / "logs" / "dc1" / "query", [ByteRange("w/future.jsonl", 0, path.stat().st_size)],
                65536, tmp / "staging" / "future")
    stats = line_stats(tmp / "staging" / "future", by_writer=True, latest_valid_us=5000, watermark_us=3000)
    assert (stats.events, stats.future_events, stats.max_timestamp_us) == (3, 2, 3000)
    # A writer seen only in the future has no progress at all.
    assert stats.writers == {"10.1.0.9:1": (3000, 3000)}
    # Nor does it move the watermark: the sketch holds only the query in time.
    assert stats.sketch == [3000] * 21 and stats.at_or_after_watermark == 1


def test_a_query_with_many_clicks_is_capped_across_work_units_and_alike_in_every_attempt(world):
    """The per-query cap (Facebook §6.6): one query's clicks come in three work units, two of them
    of two datacenters. Past the cap they are unjoinable as capped, with a grant from the registry
    that a retry gets back, so a crash between the commit and the output changes nothing."""
    spark, tmp = world["spark"], world["tmp"]
    hot = "10.1.0.1:7:1000"

    def unit(name, lines, token, dc="dc1", n=1, checkpoint=lambda point: None):
        path = write_lines(tmp / "logs" / dc / "click" / "w" / f"{name}.jsonl", lines)
        clicks = events(parse_ranges(spark, "click", tmp / "logs" / dc / "click", [ByteRange(f"w/{name}.jsonl", 0, path.stat().st_size)]))
        return join_work_unit(ClickPass(spark, world["registry"], event_store(world), policy(world), token, n, dc,
                                        tmp / "staging" / f"{token}.{n}", world["tables"], checkpoint=checkpoint,
                                        max_clicks_per_query=4), JoinInput(clicks))

    first = unit("a", [click(f"10.3.0.5:1:{i}", hot, 3000 + i) for i in range(3)], "dc1.click.1")
    assert (first.joined, first.capped) == (3, 0)
    # Four more of the hot query (the earliest of them is kept), and one of another query.
    second = [click(f"10.3.0.5:1:{i}", hot, 3010 - i) for i in range(3, 7)] + [click("10.3.0.5:2:1", "10.1.0.1:7:1001", 3100)]

    def crash(point):
        if point == "after_registry_commit":
            raise Crash(point)

    with pytest.raises(Crash):
        unit("b", second, "dc1.click.2", checkpoint=crash)
    retried = unit("b", second, "dc1.click.2", n=2)
    assert (retried.joined, retried.capped) == (2, 3)
    third = unit("c", [click("10.3.0.5:1:7", hot, 2999)], "dc2.click.1", dc="dc2")
    assert (third.joined, third.capped) == (0, 1)

    joined = read_table(spark, "joined_clicks", world["tables"]["joined_clicks"]).where(F.col("query_id") == hot)
    assert sorted(r.click_id for r in joined.collect()) == [f"10.3.0.5:1:{i}" for i in (0, 1, 2, 6)]
    unjoinable = read_table(spark, "unjoinable_clicks", world["tables"]["unjoinable_clicks"]).collect()
    assert sorted((r.click_id, r.reason) for r in unjoinable) == [
        (f"10.3.0.5:1:{i}", CAPPED_REASON) for i in (3, 4, 5, 7)]


def test_a_miss_the_query_tailer_vouched_for_is_not_retried_when_query_runs_catch_up(world):
    """c7 and c8 name queries of writer 10.1.0.1:8, which the query tailer fed to time 5 without
    them: the memory tier vouches that they were never logged. Their pending records carry that time,
    so the query runs' progress reaching it later is no reason to look them up again (only a
    backfill of that writer, or the unjoinable age, is)."""
    empty = pa.table({f.name: pa.array([], f.type) for f in PIECE_SCHEMA})
    world["registry"].remember_tailed("dc1", empty, {
        "part": 1, "offsets": {}, "writers": {"10.1.0.1:7": 1005, "10.1.0.1:8": 5},
        "latest_valid_ts": 10**16, "retention_seconds": 3600, "budget_bytes": 1 << 30})
    stats = run(world)
    assert (stats.joined, stats.pending) == (7, 2)
    records = read_table(world["spark"], "pending_clicks", world["tables"]["pending_clicks"]).collect()
    assert {(r.click_id, r.writer_ts_at_attempt) for r in records} == {("10.3.0.1:9:2007", 5), ("10.3.0.1:9:2008", 5)}
    caught_up = QueryProgress({**world["progress"].writers, "10.1.0.1:8": WriterProgress(10)})
    digest = policy(world).digest(world["tables"]["pending_clicks"], "dc1")
    assert digest.pending == 2 and digest.needs["10.1.0.1:8"][0] is None
    assert not pending_retry_decision(digest, caught_up, 86400.0).ready


@pytest.mark.parametrize("retrying", [False, True], ids=["new-lines", "retrying-pending"])
def test_pending_records_go_beside_the_outputs_unless_the_unit_retries_pending_clicks(world, monkeypatch, retrying):
    """The pending records are appended beside the outputs (spark_ops/join.py: _write), but after them
    when the unit retries pending clicks: written first, a crash before the outputs would leave the
    retried clicks resolved in their records, registered to the token with no output, and a retry of
    the unit would not retry them. Either way, a failed output write, then a retry, equals a clean run."""
    import spark_ops.join as join

    spark, tables = world["spark"], world["tables"]
    retried = read_table(spark, "pending_clicks", tables["pending_clicks"]).limit(0) if retrying else None
    real_write = join.write_output

    def failing_write(df, name, *args):
        if name == "joined_clicks":
            raise Crash("joined_clicks write")
        return real_write(df, name, *args)

    def unit(attempt):
        return ClickPass(spark, world["registry"], event_store(world), policy(world), "dc1.click.0", attempt, "dc1",
                         world["tmp"] / "staging" / "dc1.click.0", tables)

    monkeypatch.setattr(join, "write_output", failing_write)
    with pytest.raises(Crash):
        join_work_unit(unit(1), JoinInput(world["clicks"], retried))
    records = read_table(spark, "pending_clicks", tables["pending_clicks"]).count()
    assert records == (0 if retrying else 2)  # c7 and c8: recorded beside the failed write, or not yet
    monkeypatch.setattr(join, "write_output", real_write)
    again = join_work_unit(unit(2), JoinInput(world["clicks"], retried))
    assert joined_ids(world) == sorted(JOINABLE) and (again.joined, again.pending) == (7, 2)
    latest = policy(world).digest(tables["pending_clicks"], "dc1")
    assert latest.pending == 2


def test_a_click_run_dates_what_it_writes_by_its_registry_commit_and_broadcasts_no_run_value(world):
    """The run's values (the stream's progress, the clock) and its writer progress come with the
    lookup's rows, and its write time with the registry commit's answer (spark_ops/registry_calls.py):
    joined from one-row broadcast frames, they cost this run 15 Spark jobs instead of 10 (a broadcast
    is a job of its own, before the job that reads it)."""
    from resources.spark.session import SparkResource

    spark, tables = world["spark"], world["tables"]
    started = time.time()
    with SparkResource.local(shuffle_partitions=2).jobs_counted("dated-run") as jobs:
        stats = run(world)
    ended = time.time()
    assert (stats.joined, stats.pending) == (7, 2)
    assert jobs()["spark_jobs"] <= 10

    def within_the_run(times) -> bool:
        return all(started <= t.timestamp() <= ended for t in times)

    joined = read_table(spark, "joined_clicks", tables["joined_clicks"]).collect()
    assert len(joined) == 7 and within_the_run(r.joined_at for r in joined)
    records = read_table(spark, "pending_clicks", tables["pending_clicks"]).collect()
    assert len(records) == 2 and within_the_run(r.recorded_at for r in records)
    assert all(r.last_attempt_at == r.recorded_at for r in records)
    # The writer's progress the lookup carried: c7 and c8's writer (10.1.0.1:8) was never ingested.
    assert {(r.query_writer, r.writer_ts_at_attempt, r.writer_backfills_at_attempt) for r in records} == {("10.1.0.1:8", None, 0)}
