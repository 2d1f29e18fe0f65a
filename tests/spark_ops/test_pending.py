"""The pending rule (spark_ops/pending.py) is written once: Spark, DuckDB and Python (through
DuckDB) evaluate the same SQL on the same records and must agree."""

import time
from datetime import datetime, timedelta

import duckdb
import pyarrow as pa
from pyspark.sql import functions as F

from resources.event_store.progress import QueryProgress, QueryTail, WriterProgress
from resources.settings import PipelineSettings
from resources.state.layout import DataLayout
from spark_ops.pending import (COLUMNS, CURRENT_SQL, PendingDigest, age_reached_sql, current_pending, evaluate,
                               pending_records, pending_retry, pending_retry_decision)
from spark_ops.schemas import arrow_schema
from spark_ops.tables import TABLE_SCHEMAS

SCHEMA = TABLE_SCHEMAS["pending_clicks"][0]
PROGRESS_TS = 1_000_000_000
AFTER_SECONDS = 10.0
T0 = datetime(2026, 11, 26, 12, 0, 0)


def record(dc: str, click_id: str, ts: int, recorded_s: int, resolved: bool = False) -> dict:
    row = {name: None for name in COLUMNS}
    row.update(dc=dc, click_id=click_id, query_id="q-" + click_id, timestamp_us=ts, attempts=1,
               recorded_at=T0 + timedelta(seconds=recorded_s), resolved=resolved,
               last_attempt_at=T0 + timedelta(seconds=recorded_s))
    return row


# Around the age boundary (PROGRESS_TS - 10 s), and every way a click's latest record can fall: a
# newer record, a resolved one, a tie on recorded_at broken by `resolved`, another datacenter's.
BOUNDARY = PROGRESS_TS - int(AFTER_SECONDS * 1e6)
RECORDS = [
    record("dc1", "older-than-age", BOUNDARY - 1, 0),
    record("dc1", "at-age", BOUNDARY, 0),
    record("dc1", "younger", BOUNDARY + 1, 0),
    record("dc1", "resolved-later", BOUNDARY - 5, 0), record("dc1", "resolved-later", BOUNDARY - 5, 5, resolved=True),
    record("dc1", "pending-again", BOUNDARY + 9, 0, resolved=True), record("dc1", "pending-again", BOUNDARY + 9, 7),
    record("dc1", "tie", BOUNDARY - 2, 3), record("dc1", "tie", BOUNDARY - 2, 3, resolved=True),
    record("dc2", "resolved-later", BOUNDARY - 5, 1),
]


def records_table() -> pa.Table:
    return pa.Table.from_pylist(RECORDS, schema=arrow_schema(SCHEMA))


def records_frame(spark):
    return spark.createDataFrame([tuple(r[name] for name in COLUMNS) for r in RECORDS], SCHEMA)


def test_spark_and_duckdb_find_the_same_current_pending_clicks(spark):
    frame = records_frame(spark)
    by_spark = {(r.dc, r.click_id) for r in current_pending(frame).select("dc", "click_id").collect()}
    con = duckdb.connect()
    con.register("records", records_table())
    by_duckdb = set(con.sql(f"SELECT dc, click_id FROM ({CURRENT_SQL})").fetchall())
    assert by_spark == by_duckdb == {("dc1", "older-than-age"), ("dc1", "at-age"), ("dc1", "younger"),
                                     ("dc1", "pending-again"), ("dc2", "resolved-later")}


def test_one_builder_dates_every_kind_of_pending_record(spark):
    """pending_records, the one definition of a record (a lookup's, spark_ops/join.py through
    record_pending; recovery's, spark_ops/verification.py): a record a lookup leaves pending was
    attempted when recorded, a resolved one keeps its click's last attempt, and a click never looked
    up (re-injected) has none, so no backoff holds it."""
    later = T0 + timedelta(seconds=60)
    rows = [record("dc1", "left-pending", 1, 0), record("dc1", "resolved", 2, 0, resolved=True),
            {**record("dc1", "reinjected", 3, 0), "attempts": 0, "last_attempt_at": None}]
    frame = spark.createDataFrame([tuple(r[name] for name in COLUMNS) for r in rows], SCHEMA)
    records = pending_records(frame.drop("recorded_at"), F.lit(later).cast("timestamp"))
    assert records.columns == COLUMNS
    assert {r.click_id: (r.last_attempt_at, r.recorded_at) for r in records.collect()} == {
        "left-pending": (later, later), "resolved": (T0, later), "reinjected": (None, later)}


def test_spark_duckdb_and_python_agree_on_the_unjoinable_age(spark):
    age = age_reached_sql(PROGRESS_TS, AFTER_SECONDS)
    frame = records_frame(spark)
    by_spark = {r.click_id for r in frame.where(F.expr(age)).select("click_id").distinct().collect()}
    con = duckdb.connect()
    con.register("records", records_table())
    by_duckdb = {r[0] for r in con.sql(f"SELECT DISTINCT click_id FROM records WHERE {age}").fetchall()}
    by_python = {r["click_id"] for r in RECORDS if evaluate(age_reached_sql(PROGRESS_TS, AFTER_SECONDS, str(r["timestamp_us"])))}
    assert by_spark == by_duckdb == by_python == {"older-than-age", "at-age", "resolved-later", "tie"}
    assert age_reached_sql(None, AFTER_SECONDS) == "FALSE"


def test_the_dispatchers_decision_uses_the_same_age():
    progress = QueryProgress(writers={"w:1": WriterProgress(PROGRESS_TS)})
    for oldest, due in ((BOUNDARY - 1, True), (BOUNDARY, True), (BOUNDARY + 1, False)):
        digest = PendingDigest(pending=1, oldest_ts=oldest, stream_ts=PROGRESS_TS - 1)
        decision = pending_retry_decision(digest, progress, AFTER_SECONDS)
        assert decision.ready is due, (oldest, decision)
        assert (decision.reason == "pending clicks reached the unjoinable age") is due


def test_pending_retries_go_by_the_tailed_writers_times_while_the_tailer_runs(tmp_path):
    layout = DataLayout(tmp_path)
    PendingDigest(pending=1, needs={"10.1.0.1:7": [500, 0]}, oldest_ts=400).save(layout.pending_digest_file("dc1"))
    QueryProgress.merge(layout.query_progress_file("dc1"), {"10.1.0.1:7": (100, 200)})
    QueryProgress.merge(layout.query_tail_progress_file("dc1"), {"10.1.0.1:7": (100, 600)})
    settings = PipelineSettings()
    assert not pending_retry(layout, "dc1", settings).ready  # no fresh mirror: the query runs' progress alone
    QueryTail(part=1, updated_at=time.time()).save(layout.query_tail_file("dc1"))
    assert pending_retry(layout, "dc1", settings).ready
