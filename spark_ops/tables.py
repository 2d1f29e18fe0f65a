"""The Delta tables under `<data-dir>/warehouse/` and the idempotent ways this project writes.

A work unit's rows carry its id (`work_unit`), and only its own attempts can write them: a first
attempt writes with a plain append (one commit, nothing read), and only a retry pays for making
the write idempotent, since only a retry can find an earlier attempt's commit.
- `append_once`: a retry appends nothing if the table holds any row of its work unit (a Delta commit
  is atomic: one row means all of them). Delta's transaction ids (`txnAppId`) would do the same for
  every attempt, at ~0.6 s more per append (they make Delta rebuild its log state).
- `write_output` for outputs whose key must never repeat (`click_id`): a retry MERGEs, inserting only
  keys absent among its work unit's rows (`insert_new`), so even a retry that joins more clicks than
  its first attempt cannot duplicate one. The registry gives a click id to one work unit only, so
  only an earlier attempt of the same unit can have written it, and Delta skips every other file by
  its statistics.

Delta is reached through SQL and the DataFrame writer only, never the `DeltaTable` Python API: that
API has no Spark Connect backend for delta-spark 4.0 (resources/spark/session.py), and the same code runs on
a local session and a Connect session.

Every commit but a compaction's holds the table's lock (`table_lock`): a run that reads a table
and then rewrites it (recovery, the pending clicks' compaction) must not miss an append made in
between, which Delta's conflict checks let through (a blind append never conflicts). That a log file
is created by one writer only, across the JVMs of two datacenters, is the log store's promise
(resources/spark/log_store.py), not the lock's: so `compact` (OPTIMIZE, seconds of rewriting) holds no lock,
and a click run's append beside it waits for nothing.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import deltalake
import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_ops.meter import count_commit
from spark_ops.schemas import CLICK_FIELDS, QUERY_LINE_FIELDS, QUERY_STRUCT, SOURCE_FIELDS, arrow_schema


def _f(name: str, dt: T.DataType) -> T.StructField:
    return T.StructField(name, dt)


CLICK_EVENT = [f for f in CLICK_FIELDS if f.name != "extra"] + [_f("click_extra", T.StringType())]

TABLE_SCHEMAS: dict[str, tuple[T.StructType, list[str]]] = {
    # The EventStore's durable tier: where each datacenter's valid query lines of the last hour lie in
    # the raw logs, by id (the logs are durable and never rewritten: the lines are not copied).
    "query_logs": (
        T.StructType([_f("dc", T.StringType()), *[f for f in QUERY_LINE_FIELDS if f.name != "line"], *SOURCE_FIELDS,
                      _f("work_unit", T.StringType())]),
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
    # attempts so far, and the query writer's progress and backfills when last looked up. Appended
    # to, never updated in a pass: a click's latest record (`recorded_at`) says whether it is still
    # pending or was resolved (spark_ops/pending.py: current_pending); maintenance compacts it.
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
                _f("resolved", T.BooleanType()),
                _f("recorded_at", T.TimestampType()),
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

# Set when a table is created.
# Spark writes a table's checkpoint in the commit that reaches a multiple of its interval, inside that
# commit (Delta's post-commit hook: three jobs and a Parquet write, ~1.5 s of a click run on 2 cores).
# A click run commits once to each of the click tables: at intervals of 12-14, one click run in five
# paid a checkpoint, and those runs made the tail of a live run's latency (issue 42, round
# twenty-one). At ~50 one run in eighteen pays it; a reader replays at most that many small commit files
# after the checkpoint (deltalake: ~25 ms at 110, ~6 ms at 7). Distinct intervals keep two tables
# from checkpointing in the same run.
CHECKPOINT_INTERVALS = {"query_logs": 10, "log_file_map": 11, "click_ledger": 47, "joined_clicks": 53,
                        "pending_clicks": 59}
TABLE_PROPERTIES: dict[str, dict[str, str]] = {
    name: {"delta.checkpointInterval": str(interval)} for name, interval in CHECKPOINT_INTERVALS.items()
}
# query_logs keeps file statistics only for the column its readers filter on (the cache window and
# the eviction, by event time): collecting them for every column of a query unit's ~400k rows took
# ~0.35 s of each append. A retry looks for its work unit's rows (append_once): work_unit keeps
# statistics too.
TABLE_PROPERTIES["query_logs"]["delta.dataSkippingStatsColumns"] = "timestamp_us,work_unit"
# The click ledger is read whole (verification, recovery) but for a retry's look for its work unit's
# rows: statistics of its other ten columns were written for every click of every unit.
TABLE_PROPERTIES["click_ledger"]["delta.dataSkippingStatsColumns"] = "work_unit"
# The click outputs are found by key within a work unit (a retry's MERGE: write_output), or by key
# (deduplicate). By default Delta kept statistics of their first 32 leaf columns, the joined query's
# nested ones among them, at every append and every compaction: without them a joined_clicks append
# took 17 % less and its OPTIMIZE ~12 % less, with work_unit's alone (docs/STACK.md, Delta).
TABLE_PROPERTIES.update({
    name: {**TABLE_PROPERTIES.get(name, {}), "delta.dataSkippingStatsColumns": "click_id,work_unit"}
    for name in ("joined_clicks", "unjoinable_clicks", "pending_clicks")
})
# The aggregates refresh reads what was added since it last ran (spark_ops/aggregates.py).
TABLE_PROPERTIES["joined_clicks"]["delta.enableChangeDataFeed"] = "true"


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


def sql_literal(value: str) -> str:
    """`value` as a SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def delta_path(path: str) -> str:
    """The Delta table at `path`, as SQL names it."""
    return "delta.`" + path.replace("`", "``") + "`"


def vacuum(spark: SparkSession, path: str, retain_hours: int) -> None:
    """Deletes the files of the Delta table at `path` that no version younger than `retain_hours`
    references. Whole hours only: Delta rounds RETAIN's hours to an integer (`math.round` in its
    VacuumCommand), so `RETAIN 0.25 HOURS` deleted at once every file a compaction had just removed,
    under any reader of the snapshot before it (a 2026-11-27 catch-up run: an aggregates refresh
    found its change feed's files gone)."""
    if isinstance(retain_hours, bool) or not isinstance(retain_hours, int) or retain_hours < 0:
        raise ValueError(f"VACUUM retains whole hours (Delta rounds fractions): got {retain_hours!r}")
    with table_lock(path):
        spark.sql(f"VACUUM {delta_path(path)} RETAIN {retain_hours} HOURS")


# Delta's errors for a commit that lost to a concurrent one it conflicts with (delta-error-classes.json).
CONCURRENT_COMMIT_ERRORS = ("DELTA_CONCURRENT_APPEND", "DELTA_CONCURRENT_DELETE_DELETE", "DELTA_CONCURRENT_DELETE_READ",
                            "DELTA_CONCURRENT_TRANSACTION", "DELTA_CONCURRENT_WRITE")


def compact(spark: SparkSession, path: str) -> int | None:
    """OPTIMIZE of the Delta table at `path`, without its lock: the files it removes it adds again as
    they were (no data change), so an append beside it never conflicts with it, and Delta rebases it
    onto one. Returns how many files it removed (none: Delta committed nothing), or None when it lost
    to a concurrent rewrite of the files it compacted (recovery, a retry's MERGE): those files are for
    the next compaction."""
    try:
        return spark.sql(f"OPTIMIZE {delta_path(path)}").collect()[0]["metrics"]["numFilesRemoved"]
    except Exception as error:
        if any(name in str(error) for name in CONCURRENT_COMMIT_ERRORS):
            return None
        raise


def commit_actions(path: str, version: int) -> list[dict]:
    """The actions of one commit of the Delta table at `path`, read from its commit file in the log."""
    commit = Path(path) / "_delta_log" / f"{version:020d}.json"
    return [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]


def table_committed(path: str) -> bool:
    """Whether the Delta table at `path` has a first commit. Its `_delta_log` directory appears before
    that commit does (a reader there in between finds no table); a commit file appears whole (renamed
    into place)."""
    log = Path(path) / "_delta_log"
    return log.is_dir() and any(f.suffix == ".json" or f.name.endswith(".checkpoint.parquet") for f in log.iterdir())


def ensure_table(name: str, path: str) -> None:
    """Creates the Delta table at `path`, empty, with its schema, partitioning and properties, unless
    a run already did. By deltalake, in milliseconds: a Spark `CREATE TABLE` is a commit of ~1 s (a
    fresh data directory's first query and click runs paid ~3 s and ~2 s for theirs). Under the
    table's lock: another datacenter's process may be creating it at the same moment."""
    if table_committed(path):
        return
    schema, partitions = TABLE_SCHEMAS[name]
    with table_lock(path):
        if not table_committed(path):
            deltalake.DeltaTable.create(path, arrow_schema(schema), partition_by=partitions or None,
                                        configuration=TABLE_PROPERTIES.get(name) or None)
            write_first_checksum(path)


def write_first_checksum(path: str) -> None:
    """The Version Checksum file of an empty table's first version (Delta's protocol: "Version Checksum
    File"), which `deltalake` does not write: no files, and the protocol and metadata its commit set.
    Spark's Delta reads a version's protocol and metadata from that file and derives the next
    version's checksum from it; without it, the first Spark commit to each table reconstructed the
    table's state with Spark jobs ("Compute snapshot for version: 0"), on a fresh JVM with their code
    compiled first: a fresh deployment's first click run ran 29 Spark jobs, 17 with it (docs/STACK.md).
    Never replaces a checksum file: written aside, then linked into place."""
    log = Path(path) / "_delta_log"
    first = {key: action[key] for action in commit_actions(path, 0) for key in ("protocol", "metaData") if key in action}
    checksum = {"tableSizeBytes": 0, "numFiles": 0, "numMetadata": 1, "numProtocol": 1, "setTransactions": [],
                "domainMetadata": [], "metadata": first["metaData"], "protocol": first["protocol"]}
    aside = log / f".{0:020d}.crc.{os.getpid()}.{threading.get_ident()}"
    aside.write_text(json.dumps(checksum))
    try:
        os.link(aside, log / f"{0:020d}.crc")
    except FileExistsError:
        pass
    finally:
        aside.unlink()


def merge_into(path: str, source: DataFrame, clauses: str) -> None:
    """`MERGE INTO` the Delta table at `path` (alias t) from `source` (alias s): `clauses` is the
    statement's `ON ... WHEN ...` part. The caller holds the table's lock and counts the commit."""
    source.sparkSession.sql(f"MERGE INTO {delta_path(path)} AS t USING {{source}} AS s {clauses}", source=source)


def read_table(spark: SparkSession, name: str, path: str) -> DataFrame:
    ensure_table(name, path)
    return spark.read.format("delta").load(path)


def delta_rows(name: str, path: str, version: int | None = None) -> ds.Dataset | pa.Table:
    """The Delta table at `path`, at `version` or its latest, as the deltalake reader reads it (a
    dataset scanned on demand, in this process: no Spark job); no rows of its schema if no run
    committed it yet."""
    if not table_committed(path):
        return no_rows(name)
    return deltalake.DeltaTable(path, version=version).to_pyarrow_dataset()


def no_rows(name: str) -> pa.Table:
    return arrow_schema(TABLE_SCHEMAS[name][0]).empty_table()


# What DuckDB may hold over the tables at once, beyond which it spills to a directory of the connection's
# own under the system's temporary directory (no two connections, in one process or two, share spill
# files, and the directory goes with its connection): its default,
# 80 % of the machine's memory, let a `check_tables` run of a live `photon up` reach 511 MiB of PSS (the
# checks over every table and the registry's ids; benchmarks/README.md, round twenty-three), a fifth of
# the deployment's budget, beside the click runs.
DUCKDB_MEMORY_LIMIT = "256MB"
SPILL_PREFIX = "photon-duckdb-spill-"


@contextmanager
def duckdb_over(relations: dict[str, ds.Dataset | pa.Table]) -> Iterator[duckdb.DuckDBPyConnection]:
    """A DuckDB connection with each relation (delta_rows, or a table) registered under its name, within
    DUCKDB_MEMORY_LIMIT, closed on exit."""
    with tempfile.TemporaryDirectory(prefix=SPILL_PREFIX) as spill:
        con = duckdb.connect(config={"memory_limit": DUCKDB_MEMORY_LIMIT, "temp_directory": spill})
        try:
            for name, rows in relations.items():
                con.register(name, rows)
            yield con
        finally:
            con.close()


def one_row(con: duckdb.DuckDBPyConnection, query: str) -> dict:
    """The one row a DuckDB query over tables (delta_rows) returns, by column name."""
    relation = con.sql(query)
    (row,) = relation.fetchall()
    return dict(zip(relation.columns, row))


def row_count(spark: SparkSession, name: str, path: str, partitions: dict[str, list[str]] | None = None) -> int:
    """Rows of a Delta table (created empty if no run wrote it yet), or of its partitions whose values
    are among `partitions` (column -> values), summed from the row counts its log records for each
    data file. The `deltalake` reader reads the log in tens of milliseconds, where a Spark count of
    the same statistics is a job or more (~0.3-1 s a table in a click run); Spark counts if a file
    has no statistics."""
    ensure_table(name, path)
    files = pa.table(deltalake.DeltaTable(path).get_add_actions(flatten=True))
    for column, values in (partitions or {}).items():
        files = files.filter(pc.is_in(files[f"partition.{column}"], pa.array(values, pa.string())))
    records = files.column("num_records")
    if records.null_count:
        rows = read_table(spark, name, path)
        for column, values in (partitions or {}).items():
            rows = rows.where(F.col(column).isin(values))
        return rows.count()
    return pc.sum(records).as_py() or 0


def latest_version(path: str) -> int:
    """The committed table's latest version, read from its Delta log by deltalake (no Spark job)."""
    return deltalake.DeltaTable(path).version()


def files_under(path: str, size_bytes: int) -> int:
    """The data files of the committed table's current version smaller than `size_bytes`, from its
    Delta log (deltalake, no Spark job)."""
    sizes = pa.table(deltalake.DeltaTable(path).get_add_actions()).column("size_bytes")
    return pc.sum(pc.less(sizes, size_bytes)).as_py() or 0


def rows_held(path: str, **partition: str) -> int | None:
    """The rows of the committed table's current version (of one partition, by its column's value),
    from the file statistics in its Delta log (deltalake, no Spark job); None if a file has none."""
    files = pa.table(deltalake.DeltaTable(path).get_add_actions(flatten=True))
    for column, value in partition.items():
        files = files.filter(pc.equal(files.column(f"partition.{column}"), value))
    records = files.column("num_records")
    return None if records.null_count else int(pc.sum(records).as_py() or 0)


def latest_snapshot(spark: SparkSession, name: str, path: str) -> tuple[int, DataFrame]:
    """The table's latest version and a DataFrame pinned to it."""
    ensure_table(name, path)
    version = latest_version(path)
    return version, spark.read.format("delta").option("versionAsOf", version).load(path)


def unit_written(spark: SparkSession, name: str, path: str, work_unit: str) -> bool:
    """Whether the table holds a row of the work unit (Delta skips other units' files by their
    `work_unit` statistics)."""
    return not read_table(spark, name, path).where(F.col("work_unit") == work_unit).isEmpty()


def append(df: DataFrame, name: str, path: str) -> None:
    ensure_table(name, path)
    schema, _ = TABLE_SCHEMAS[name]
    with table_lock(path):
        df.select(*schema.fieldNames()).write.format("delta").mode("append").save(path)
    count_commit(name)


def append_once(df: DataFrame, name: str, path: str, work_unit: str, attempt: int) -> None:
    """Appends a work unit's rows (`df` has its `work_unit` column) unless an earlier attempt did."""
    if attempt > 1 and unit_written(df.sparkSession, name, path, work_unit):
        return
    append(df, name, path)


def write_output(df: DataFrame, name: str, path: str, key: str, work_unit: str, attempt: int) -> None:
    """Writes a work unit's output rows, keyed by `key`: appended by a first attempt, merged by a
    retry so that no key is written twice."""
    if attempt == 1:
        append(df, name, path)
    else:
        insert_new(df, name, path, key, {"work_unit": work_unit})


def insert_new(df: DataFrame, name: str, path: str, key: str, within: dict[str, str] | None = None) -> None:
    """Inserts the rows of `df` whose `key` the table lacks; `within` (column -> value) limits the
    search to the table's rows with those values, the only ones that can hold the keys."""
    ensure_table(name, path)
    schema, _ = TABLE_SCHEMAS[name]
    condition = f"t.`{key}` = s.`{key}`" + "".join(
        f" AND t.`{column}` = {sql_literal(value)}" for column, value in (within or {}).items()
    )
    with table_lock(path):
        merge_into(path, df.select(*schema.fieldNames()), f"ON {condition} WHEN NOT MATCHED THEN INSERT *")
    count_commit(name)


def overwrite_where(df: DataFrame, name: str, path: str, condition: str) -> None:
    """Replaces the table's rows that meet the SQL `condition` by `df`'s (which must meet it too)."""
    ensure_table(name, path)
    schema, _ = TABLE_SCHEMAS[name]
    with table_lock(path):
        df.select(*schema.fieldNames()).write.format("delta").mode("overwrite").option("replaceWhere", condition).save(path)
    count_commit(name)


def overwrite(df: DataFrame, name: str, path: str) -> None:
    ensure_table(name, path)
    schema, _ = TABLE_SCHEMAS[name]
    with table_lock(path):
        df.select(*schema.fieldNames()).write.format("delta").mode("overwrite").save(path)
    count_commit(name)
