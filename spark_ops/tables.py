"""The Delta tables under `<data-dir>/warehouse/` and the two idempotent ways this project writes.

- `append_once`: an append tagged with Delta's transaction id (`txnAppId`, `txnVersion`); a retry of
  the same work unit that already committed is skipped by Delta itself.
- `insert_new`: MERGE inserting only keys absent from the table. Used for outputs whose key must
  never repeat (`click_id`): even a retried work unit that joins more clicks than its first attempt
  cannot duplicate one. The join scopes it to the work unit's own rows (`within`): the registry
  gives a click id to one work unit only, so only an earlier attempt of the same unit can have
  written it, and Delta then skips every other file by its statistics instead of the MERGE reading
  the whole table for the keys (a cost that grew with the table, run after run).

Every commit holds the table's lock (`table_lock`). Delta needs the storage to let only one writer
create a given log file; on a local file system its LogStore guarantees that only within one JVM, and
each datacenter's `photon run` is its own JVM writing the same tables.
"""

from __future__ import annotations

import fcntl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_ops.schemas import CLICK_FIELDS, QUERY_FIELDS, QUERY_STRUCT, SOURCE_FIELDS


def _f(name: str, dt: T.DataType) -> T.StructField:
    return T.StructField(name, dt)


CLICK_EVENT = [f for f in CLICK_FIELDS if f.name != "extra"] + [_f("click_extra", T.StringType())]

TABLE_SCHEMAS: dict[str, tuple[T.StructType, list[str]]] = {
    "query_logs": (
        T.StructType([_f("dc", T.StringType()), *QUERY_FIELDS, *SOURCE_FIELDS, _f("work_unit", T.StringType())]),
        ["dc"],
    ),
    "log_file_map": (
        T.StructType(
            [
                _f("dc", T.StringType()),
                _f("server_ip", T.StringType()),
                _f("process_id", T.StringType()),
                _f("timestamp_us", T.LongType()),
                _f("file", T.StringType()),
                _f("offset", T.LongType()),
                _f("work_unit", T.StringType()),
            ]
        ),
        ["dc"],
    ),
    # Every valid click line each datacenter's pipeline has read: the universe for completeness,
    # duplicate counting, and the source of pending clicks to retry.
    "click_ledger": (
        T.StructType([_f("dc", T.StringType()), *CLICK_FIELDS, *SOURCE_FIELDS, _f("work_unit", T.StringType())]),
        ["dc"],
    ),
    # Clicks whose query was not found yet, per datacenter, with what their retries depend on: the
    # attempts so far, and the query writer's progress and backfills when last looked up.
    "pending_clicks": (
        T.StructType(
            [
                _f("dc", T.StringType()),
                *CLICK_EVENT,
                _f("query_writer", T.StringType()),
                _f("query_ts", T.LongType()),
                _f("attempts", T.IntegerType()),
                _f("last_attempt_at", T.TimestampType()),
                _f("last_attempt_unit", T.StringType()),
                _f("writer_ts_at_attempt", T.LongType()),
                _f("writer_backfills_at_attempt", T.IntegerType()),
            ]
        ),
        ["dc"],
    ),
    "joined_clicks": (
        T.StructType(
            [
                *CLICK_EVENT,
                _f("query", QUERY_STRUCT),
                _f("joined_by_dc", T.StringType()),
                _f("joined_at", T.TimestampType()),
                _f("work_unit", T.StringType()),
            ]
        ),
        [],
    ),
    "unjoinable_clicks": (
        T.StructType(
            [
                *CLICK_EVENT,
                _f("reason", T.StringType()),
                _f("dc", T.StringType()),
                _f("recorded_at", T.TimestampType()),
                _f("work_unit", T.StringType()),
            ]
        ),
        [],
    ),
    "click_aggregates": (
        T.StructType(
            [
                _f("advertiser_id", T.StringType()),
                _f("minute", T.TimestampType()),
                _f("clicks", T.LongType()),
                _f("cost_micros", T.LongType()),
            ]
        ),
        [],
    ),
    "quarantined_lines": (
        T.StructType(
            [
                _f("dc", T.StringType()),
                _f("stream", T.StringType()),
                *SOURCE_FIELDS,
                _f("reason", T.StringType()),
                _f("snippet", T.StringType()),
                _f("work_unit", T.StringType()),
            ]
        ),
        ["dc"],
    ),
}

# Set when a table is created. query_logs keeps file statistics only for the column its readers
# filter on (the cache window and the eviction, by event time): collecting them for every column of
# a query unit's ~400k rows took ~0.35 s of each append.
TABLE_PROPERTIES: dict[str, dict[str, str]] = {
    "query_logs": {"delta.dataSkippingStatsColumns": "timestamp_us"},
}


_lock_guard = threading.Lock()
_thread_locks: dict[Path, threading.RLock] = {}
_held: dict[Path, tuple[int, object]] = {}  # lock file -> (depth, open file holding the flock)


@contextmanager
def table_lock(path: str) -> Iterator[None]:
    """Exclusive right to commit to the Delta table at `path`, across processes (an flock on
    `<warehouse>/.locks/<table>.lock`) and threads; re-entrant within a thread."""
    lock_file = Path(path).parent / ".locks" / f"{Path(path).name}.lock"
    with _lock_guard:
        in_process = _thread_locks.setdefault(lock_file, threading.RLock())
    with in_process:
        depth, handle = _held.get(lock_file, (0, None))
        if depth == 0:
            lock_file.parent.mkdir(parents=True, exist_ok=True)
            handle = open(lock_file, "a")
            fcntl.flock(handle, fcntl.LOCK_EX)
        _held[lock_file] = (depth + 1, handle)
        try:
            yield
        finally:
            depth, handle = _held.pop(lock_file)
            if depth > 1:
                _held[lock_file] = (depth - 1, handle)
            else:
                handle.close()  # releases the flock


@contextmanager
def tables_locked(paths: list[str]) -> Iterator[None]:
    """Every table of `paths` locked (in a fixed order, so two holders never deadlock)."""
    if not paths:
        yield
        return
    first, *rest = sorted(paths)
    with table_lock(first), tables_locked(rest):
        yield


def ensure_table(spark: SparkSession, name: str, path: str) -> None:
    if (Path(path) / "_delta_log").is_dir():
        return
    schema, partitions = TABLE_SCHEMAS[name]
    with table_lock(path):
        builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(schema)
        if partitions:
            builder = builder.partitionedBy(*partitions)
        for key, value in TABLE_PROPERTIES.get(name, {}).items():
            builder = builder.property(key, value)
        builder.execute()


def read_table(spark: SparkSession, name: str, path: str) -> DataFrame:
    ensure_table(spark, name, path)
    return spark.read.format("delta").load(path)


def row_count(spark: SparkSession, name: str, path: str) -> int:
    """Rows of a Delta table (created empty if no run wrote it yet); answered from the log's file
    statistics, without a scan."""
    return read_table(spark, name, path).count()


def latest_snapshot(spark: SparkSession, name: str, path: str) -> tuple[int, DataFrame]:
    """The table's latest version and a DataFrame pinned to it."""
    ensure_table(spark, name, path)
    version = DeltaTable.forPath(spark, path).history(1).first()["version"]
    return version, spark.read.format("delta").option("versionAsOf", version).load(path)


def append_once(df: DataFrame, name: str, path: str, app_id: str, version: int = 1) -> None:
    ensure_table(df.sparkSession, name, path)
    schema, _ = TABLE_SCHEMAS[name]
    with table_lock(path):
        (
            df.select(*schema.fieldNames())
            .write.format("delta")
            .mode("append")
            .option("txnAppId", app_id)
            .option("txnVersion", version)
            .save(path)
        )


def insert_new(df: DataFrame, name: str, path: str, key: str, within: dict[str, str] | None = None) -> None:
    """Inserts the rows of `df` whose `key` the table lacks; `within` (column -> value) limits the
    search to the table's rows with those values, the only ones that can hold the keys."""
    spark = df.sparkSession
    ensure_table(spark, name, path)
    schema, _ = TABLE_SCHEMAS[name]
    condition = F.col(f"t.{key}") == F.col(f"s.{key}")
    for column, value in (within or {}).items():
        condition &= F.col(f"t.{column}") == F.lit(value)
    with table_lock(path):
        (
            DeltaTable.forPath(spark, path)
            .alias("t")
            .merge(df.select(*schema.fieldNames()).alias("s"), condition)
            .whenNotMatchedInsertAll()
            .execute()
        )


def overwrite(df: DataFrame, name: str, path: str) -> None:
    ensure_table(df.sparkSession, name, path)
    schema, _ = TABLE_SCHEMAS[name]
    with table_lock(path):
        df.select(*schema.fieldNames()).write.format("delta").mode("overwrite").save(path)
