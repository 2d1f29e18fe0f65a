"""The joiner's exactly-once guarantees, on real Spark, Delta and DuckDB, at each crash point."""

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from resources.layout import TABLES
from resources.registry_shards import ShardedIdRegistry
from resources.stream_state import QueryProgress, WriterProgress
from spark_ops.event_store import EventStore
from spark_ops.ingest import ingest_queries, line_stats
from spark_ops.join import CRASH_POINTS, join_work_unit
from spark_ops.parse import ByteRange, events, parse_ranges
from spark_ops.pending import PendingPolicy
from spark_ops.tables import read_table
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
    parsed = parse_ranges(spark, "query", logs / "query", [ByteRange("w/0.jsonl", 0, qfile.stat().st_size)])
    stats = line_stats(parsed, by_writer=True)
    ingest_queries(parsed, stats, "dc1", "dc1.query.0", 1, tables, 10, 1 << 20)
    progress = QueryProgress({w: WriterProgress(ts) for w, (_, ts) in stats.writers.items()})
    clicks = events(parse_ranges(spark, "click", logs / "click", [ByteRange("w/0.jsonl", 0, cfile.stat().st_size)]))
    registry = ShardedIdRegistry(tmp_path / "registry", gc_interval_seconds=None)
    yield {"spark": spark, "tables": tables, "clicks": clicks, "registry": registry, "tmp": tmp_path,
           "query_dir": logs / "query", "progress": progress}
    registry.close()


def event_store(world) -> EventStore:
    spark, tables = world["spark"], world["tables"]
    return EventStore(
        read_table(spark, "query_logs", tables["query_logs"]), read_table(spark, "log_file_map", tables["log_file_map"]),
        world["query_dir"], 10, 1 << 20, 65536,
    )


def policy(world, **overrides) -> PendingPolicy:
    knobs = {"unjoinable_after_seconds": 86400.0, "min_attempts": 2, "backoff_seconds": 2.0, "backoff_max_seconds": 600.0}
    return PendingPolicy(progress=world["progress"], **{**knobs, **overrides})


def run(world, token="dc1.click.0", dc="dc1", registry=None, checkpoint=lambda point: None, pending=None, attempt=1,
        **kwargs):
    return join_work_unit(
        world["spark"], world["clicks"], event_store(world), registry or world["registry"], token, attempt, dc,
        world["tmp"] / "staging" / token, world["tables"], pending or policy(world), checkpoint=checkpoint, **kwargs,
    )


def joined_ids(world) -> list[str]:
    rows = read_table(world["spark"], "joined_clicks", world["tables"]["joined_clicks"]).select("click_id").collect()
    return sorted(r.click_id for r in rows)


def test_clean_run_joins_each_click_once(world):
    stats = run(world)
    assert joined_ids(world) == sorted(JOINABLE)
    assert (stats.clicks, stats.joined, stats.pending, stats.refused) == (9, 7, 2, 0)
    row = read_table(world["spark"], "joined_clicks", world["tables"]["joined_clicks"]).where(
        F.col("click_id") == "10.3.0.1:9:2003").first()
    assert row.query.query_id == "10.1.0.1:7:1003" and row.query.ads[0].bid_micros == 500
    assert row.joined_by_dc == "dc1" and row.work_unit == "dc1.click.0"
    assert world["registry"].stats()["total"]["ids_with_token"] == 0  # output durable: tokens cleared


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
