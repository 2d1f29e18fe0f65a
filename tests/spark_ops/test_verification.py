"""Verification and recovery transformations (Photon §3.3.3) and the table commit lock, on real
Spark and Delta."""

import datetime
import subprocess
import sys

import pyarrow as pa
from pyspark.sql import types as T

from resources.registry.shards import SCAN_SCHEMA
from resources.state.layout import TABLES
from spark_ops.pending import pending_of
from spark_ops.tables import TABLE_SCHEMAS, append_once, no_rows, read_table, table_lock
from spark_ops.verification import (
    VERIFIED_TABLES,
    add_pending,
    click_accounting,
    confirmed_tokens,
    lost_ids,
    missing_data_files,
    reinjected_clicks,
    registry_counts,
    repair_table,
    untracked_clicks,
    verification_db,
)

REGISTERED = T.StructType([T.StructField("click_id", T.StringType()), T.StructField("timestamp_us", T.LongType()),
                           T.StructField("token", T.StringType())])
IDS = T.StructType([T.StructField("click_id", T.StringType())])


def ledger_rows(spark, rows):
    """click_ledger rows from (dc, click_id, work_unit)."""
    schema = TABLE_SCHEMAS["click_ledger"][0]
    return spark.createDataFrame(
        [(dc, cid, "10.1.0.1:7:100", 200, "ad1", "adv1", 5, "{}", "f", 0, 10, unit) for dc, cid, unit in rows], schema
    )


def ids(*click_ids: str) -> pa.Table:
    return pa.table({"click_id": pa.array(click_ids, pa.string())})


def test_lost_ids_are_those_without_output_and_without_a_work_unit_in_flight():
    registered = pa.Table.from_pylist([
        {"click_id": "joined", "timestamp_us": 1, "token": None},
        {"click_id": "lost_cleared", "timestamp_us": 2, "token": None},
        {"click_id": "lost_finished", "timestamp_us": 3, "token": "dc1.click.1"},
        {"click_id": "in_flight", "timestamp_us": 4, "token": "dc2.click.7"},
        {"click_id": "unjoinable", "timestamp_us": 5, "token": "dc1.click.1"},
    ], schema=SCAN_SCHEMA)
    relations = {**{name: no_rows(name) for name in VERIFIED_TABLES}, "joined_clicks": ids("joined"),
                 "unjoinable_clicks": ids("unjoinable")}
    with verification_db(relations, registered, ["dc2.click.7"]) as db:
        assert lost_ids(db).column("click_id").to_pylist() == ["lost_cleared", "lost_finished"]
        # dc1.click.1 wrote the unjoinable row but kept its token: that token is to be cleared.
        assert confirmed_tokens(db) == ["dc1.click.1"]
        assert registry_counts(db) == {"registered_ids": 5, "ids_with_token": 3, "lost_ids": 2,
                                       "lost_ids_with_token": 1, "tokens_to_clear": 1}


def test_each_distinct_click_is_counted_where_it_is():
    """A click is seen once however many datacenters read it; pending unless registered or
    unjoinable, and tracked if any datacenter's latest record of it is pending."""
    ledger = pa.Table.from_pylist(
        [{"dc": dc, "click_id": c, "work_unit": unit} for dc, c, unit in [
            ("dc1", "j", "dc1.click.1"), ("dc2", "j", "dc2.click.1"), ("dc1", "p", "dc1.click.1"),
            ("dc1", "u", "dc1.click.1"), ("dc1", "lost", "dc1.click.1"), ("dc1", "untracked", "dc1.click.2"),
            ("dc1", "reading", "dc1.click.3")]])
    at = datetime.datetime(2026, 11, 26, tzinfo=datetime.timezone.utc)
    pending = pa.Table.from_pylist([
        {"dc": "dc1", "click_id": "p", "resolved": False, "recorded_at": at},
        {"dc": "dc2", "click_id": "p", "resolved": True, "recorded_at": at + datetime.timedelta(seconds=1)},
        {"dc": "dc1", "click_id": "untracked", "resolved": False, "recorded_at": at},
        {"dc": "dc1", "click_id": "untracked", "resolved": True, "recorded_at": at + datetime.timedelta(seconds=1)},
    ])
    registered = pa.Table.from_pylist([{"click_id": c, "timestamp_us": 1, "token": None} for c in ("j", "lost")],
                                      schema=SCAN_SCHEMA)
    relations = {"click_ledger": ledger, "joined_clicks": ids("j", "never_seen"), "unjoinable_clicks": ids("u"),
                 "pending_clicks": pending}
    with verification_db(relations, registered, ["dc1.click.3"]) as db:
        assert click_accounting(db) == {
            "distinct_clicks": 6, "joined": 2, "unjoinable": 1, "pending": 3, "pending_untracked": 1,
            "joined_and_unjoinable": 0, "output_never_seen": 1, "registered_without_output": 1,
        }


def test_untracked_and_reinjected_clicks_go_to_the_datacenter_that_registered_them(spark):
    ledger = ledger_rows(spark, [("dc1", "a", "dc1.click.1"), ("dc2", "a", "dc2.click.1"),
                                 ("dc1", "b", "dc1.click.2"), ("dc2", "c", "dc2.click.3"),
                                 ("dc1", "d", "dc1.click.4"), ("dc1", "e", "dc1.click.5")])
    registered = spark.createDataFrame([("a", 200, "dc2.click.1")], REGISTERED)
    nothing = spark.createDataFrame([], IDS)
    pending = spark.createDataFrame([("b",)], IDS)
    # c: read by a finished work unit, registered nowhere, not pending: untracked. d: its work unit
    # is still in flight. e: joined, and forgotten since by the registry's garbage collection.
    joined = spark.createDataFrame([("e",)], IDS)
    untracked = untracked_clicks(ledger, registered, joined, nothing, pending, ["dc1.click.4"])
    assert [(r["click_id"], r["token"]) for r in untracked.collect()] == [("c", "dc2.click.3")]

    lost = registered.select("click_id", "token").unionByName(untracked)
    reinjected = reinjected_clicks(lost, ledger, "recovery.r1")
    # Records as every pending record is built (spark_ops/pending.py: pending_records).
    schema = TABLE_SCHEMAS["pending_clicks"][0]
    assert [(f.name, f.dataType) for f in reinjected.schema] == [(f.name, f.dataType) for f in schema]
    rows = {r["click_id"]: r for r in reinjected.collect()}
    assert set(rows) == {"a", "c"}
    assert rows["a"]["dc"] == "dc2"  # the datacenter whose work unit registered it
    assert rows["a"]["query_writer"] == "10.1.0.1:7" and rows["a"]["query_ts"] == 100
    assert rows["a"]["attempts"] == 0 and rows["a"]["last_attempt_at"] is None


def test_reinjection_is_idempotent(spark, tmp_path):
    path = str(tmp_path / "pending_clicks")
    ledger = ledger_rows(spark, [("dc1", "a", "dc1.click.1")])
    lost = spark.createDataFrame([("a", "dc1.click.1")], "click_id string, token string")
    rows = reinjected_clicks(lost, ledger, "recovery.r1")
    add_pending(spark, path, rows)
    add_pending(spark, path, rows)
    assert read_table(spark, "pending_clicks", path).count() == 1
    assert [r.click_id for r in pending_of(spark, path).collect()] == ["a"]


def test_storage_loss_is_found_and_the_table_rewritten_from_what_remains(spark, tmp_path):
    path = str(tmp_path / "warehouse" / "click_ledger")
    for unit in ("dc1.click.1", "dc1.click.2"):
        append_once(ledger_rows(spark, [("dc1", f"{unit}-x", unit)]), "click_ledger", path, unit, 1)
    assert missing_data_files(path) == []
    victim = sorted((tmp_path / "warehouse" / "click_ledger").rglob("*.parquet"))[0]
    victim.unlink()
    assert len(missing_data_files(path)) == 1
    assert repair_table(spark, "click_ledger", path) == 1
    assert missing_data_files(path) == []
    assert read_table(spark, "click_ledger", path).count() == 1
    assert repair_table(spark, "click_ledger", path) == 0


def test_table_lock_excludes_other_processes_and_is_reentrant(tmp_path):
    path = str(tmp_path / "warehouse" / TABLES[0])
    probe = ("import fcntl, sys\nf = open(sys.argv[1], 'a')\n"
             "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n    print('free')\n"
             "except BlockingIOError:\n    print('held')\n")
    lock_file = tmp_path / "warehouse" / ".locks" / f"{TABLES[0]}.lock"

    def other_process_sees() -> str:
        return subprocess.run([sys.executable, "-c", probe, str(lock_file)], capture_output=True, text=True).stdout.strip()

    with table_lock(path):
        with table_lock(path):
            assert other_process_sees() == "held"
        assert other_process_sees() == "held"
    assert other_process_sees() == "free"
