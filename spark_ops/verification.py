"""Verification and recovery (Photon §3.3.3).

An id in the registry whose output is not in `joined_clicks` or `unjoinable_clicks` is lost once no
work unit that could still write it is in flight: its token belongs to a work unit that finished
(succeeded, or failed for good), or its token was cleared and the output has gone since (storage
loss). Recovery unregisters such ids and re-injects their clicks as pending clicks, so that the
pending retries join them again, exactly once.

Verification counts (the asset checks', and the lost ids and confirmed tokens recovery acts on) are
computed by DuckDB over the tables as the deltalake reader reads them (`verification_db`): an engine
other than the Spark that wrote them, in this process, with no Spark job. Over a warm Spark Connect
server the five checks took ~11 s after a pipeline's commits (each table's first Spark read after a
commit rebuilds its Delta state, ~1 s); this way they take well under a second on the same tables.
Recovery's writes are Spark transformations.

Storage loss: a data file a Delta table still references but that is gone makes every read of the
table fail. `repair_table` rewrites the table from the files that remain; the rows lost with the file
then show up here as lost ids.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlparse

import deltalake
import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from spark_ops.query_tiers import event_id_parts
from spark_ops.pending import COLUMNS, CURRENT_SQL, pending_of, pending_records
from spark_ops.tables import (
    CLICK_EVENT, append, commit_actions, delta_rows, duckdb_over, ensure_table, no_rows, one_row, overwrite, overwrite_where, read_table,
    sql_literal, table_committed, table_lock,
)

RECOVERY_UNIT_PREFIX = "recovery"


def missing_data_files(path: str) -> list[str]:
    """Data files the table's latest version references that are not on disk. Read from the Delta
    log by deltalake in this process (milliseconds, no Spark job): `photon run` asks before its
    session has started."""
    files = deltalake.DeltaTable(path).file_uris()
    return [f for f in files if not Path(unquote(urlparse(f).path) if "://" in f else f).exists()]


def repair_table(spark: SparkSession, name: str, path: str) -> int:
    """Rewrites the table without the rows of its missing data files; returns how many files were
    missing. Under the table's lock, so no pipeline commits in between."""
    ensure_table(name, path)
    with table_lock(path):
        missing = missing_data_files(path)
        if missing:
            spark.conf.set("spark.sql.files.ignoreMissingFiles", "true")
            try:
                overwrite(spark.read.format("delta").load(path), name, path)
            finally:
                spark.conf.unset("spark.sql.files.ignoreMissingFiles")
    return len(missing)


VERIFIED_TABLES = ("click_ledger", "joined_clicks", "unjoinable_clicks", "pending_clicks")

# Every registered id with `lost`: no output, and its work unit is not in flight (`settled`); and
# `confirmed`: its output is there, and a finished work unit's token still holds it (a work unit
# that wrote its output but died before clearing its tokens).
OUTCOMES_SQL = """
    SELECT *, settled AND NOT has_output AS lost, token IS NOT NULL AND settled AND has_output AS confirmed
    FROM (SELECT click_id, timestamp_us, token,
                 token IS NULL OR token NOT IN (SELECT work_unit FROM in_flight) AS settled,
                 click_id IN (SELECT click_id FROM joined_clicks UNION SELECT click_id FROM unjoinable_clicks) AS has_output
          FROM registered)"""


def verified_tables(tables: dict[str, str]) -> dict[str, ds.Dataset | pa.Table]:
    """The tables verification reads, at their latest versions (spark_ops/tables.py: delta_rows)."""
    return {name: delta_rows(name, tables[name]) for name in VERIFIED_TABLES}


@contextmanager
def verification_db(relations: dict[str, ds.Dataset | pa.Table], registered: pa.Table,
                    in_flight: list[str]) -> Iterator[duckdb.DuckDBPyConnection]:
    """A DuckDB connection over `relations` (VERIFIED_TABLES: verified_tables), the registry's ids
    (its scan: SCAN_SCHEMA) and the work units in flight, with two views: `pending`, the current pending
    clicks of every datacenter (spark_ops/pending.py: CURRENT_SQL), and `outcomes` (OUTCOMES_SQL).
    `in_flight` must be read after the registry was scanned, so that a work unit that registered ids
    after it was read cannot look finished."""
    work_units = pa.table({"work_unit": pa.array(sorted(set(in_flight)), pa.string())})
    with duckdb_over({**{name: relations[name] for name in VERIFIED_TABLES}, "registered": registered,
                      "in_flight": work_units}) as con:
        con.execute("CREATE TEMP VIEW records AS SELECT * FROM pending_clicks")
        con.execute(f"CREATE TEMP VIEW pending AS {CURRENT_SQL}")
        con.execute(f"CREATE TEMP VIEW outcomes AS {OUTCOMES_SQL}")
        yield con


def lost_ids(con: duckdb.DuckDBPyConnection) -> pa.Table:
    """Registered ids (SCAN_SCHEMA) that are lost."""
    return con.sql("SELECT click_id, timestamp_us, token FROM outcomes WHERE lost ORDER BY click_id").to_arrow_table()


def confirmed_tokens(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Tokens that still hold confirmed ids."""
    return [row[0] for row in con.sql("SELECT DISTINCT token FROM outcomes WHERE confirmed ORDER BY token").fetchall()]


def registry_counts(con: duckdb.DuckDBPyConnection) -> dict:
    """The registry's ids by outcome (the registry_matches_output check)."""
    return one_row(con, """
        SELECT count(*) AS registered_ids, count(token) AS ids_with_token, count(*) FILTER (WHERE lost) AS lost_ids,
               count(*) FILTER (WHERE lost AND token IS NOT NULL) AS lost_ids_with_token,
               count(DISTINCT CASE WHEN confirmed THEN token END) AS tokens_to_clear
        FROM outcomes""")


def click_accounting(con: duckdb.DuckDBPyConnection) -> dict:
    """Distinct clicks by where they are (the clicks_accounted_for check): one row per click id with a
    flag per table it is in, each table read once. Not registered and not unjoinable (too old for the
    registry) is pending, and then a pending retry must know of it, unless a work unit that read it
    is still in flight."""
    return one_row(con, """
        WITH ids AS (
            SELECT click_id,
                   coalesce(bool_or(seen), FALSE) AS seen, coalesce(bool_or(read_in_flight), FALSE) AS read_in_flight,
                   coalesce(bool_or(joined), FALSE) AS joined, coalesce(bool_or(unjoinable), FALSE) AS unjoinable,
                   coalesce(bool_or(registered), FALSE) AS registered, coalesce(bool_or(settled), FALSE) AS settled,
                   coalesce(bool_or(tracked), FALSE) AS tracked
            FROM (SELECT click_id, TRUE AS seen, work_unit IN (SELECT work_unit FROM in_flight) AS read_in_flight
                  FROM click_ledger
                  UNION ALL BY NAME SELECT click_id, TRUE AS joined FROM joined_clicks
                  UNION ALL BY NAME SELECT click_id, TRUE AS unjoinable FROM unjoinable_clicks
                  UNION ALL BY NAME SELECT click_id, TRUE AS registered, settled FROM outcomes
                  UNION ALL BY NAME SELECT click_id, TRUE AS tracked FROM pending)
            GROUP BY click_id),
        flagged AS (SELECT *, seen AND NOT registered AND NOT unjoinable AS is_pending FROM ids)
        SELECT count(*) FILTER (WHERE seen) AS distinct_clicks, count(*) FILTER (WHERE joined) AS joined,
               count(*) FILTER (WHERE unjoinable) AS unjoinable,
               count(*) FILTER (WHERE is_pending) AS pending,
               count(*) FILTER (WHERE is_pending AND NOT tracked AND NOT read_in_flight) AS pending_untracked,
               count(*) FILTER (WHERE joined AND unjoinable) AS joined_and_unjoinable,
               count(*) FILTER (WHERE (joined OR unjoinable) AND NOT seen) AS output_never_seen,
               count(*) FILTER (WHERE settled AND NOT joined AND NOT unjoinable AND seen) AS registered_without_output
        FROM flagged""")


def untracked_clicks(
    ledger: DataFrame, registered: DataFrame, joined: DataFrame, unjoinable: DataFrame, pending: DataFrame,
    in_flight: list[str],
) -> DataFrame:
    """Clicks (click_id, token = a work unit that read it) that a finished work unit read but that
    are neither registered, joined, unjoinable nor pending: a click work unit that failed for good
    before it recorded its pending clicks. Recovery re-injects them like lost ids. (Joined clicks
    count even if the registry no longer holds them: its garbage collection forgets old ids.)"""
    return (
        ledger.where(~F.col("work_unit").isin(in_flight)).groupBy("click_id").agg(F.min("work_unit").alias("token"))
        .join(registered.select("click_id"), "click_id", "left_anti")
        .join(joined.select("click_id"), "click_id", "left_anti")
        .join(unjoinable.select("click_id"), "click_id", "left_anti")
        .join(pending.select("click_id"), "click_id", "left_anti")
    )


def reinjected_clicks(lost: DataFrame, ledger: DataFrame, recovery_unit: str) -> DataFrame:
    """`pending_clicks` records (spark_ops/pending.py: pending_records) for lost ids, from the click
    ledger: one per click, in the datacenter whose work unit registered it if that one read it, else
    any datacenter that did. Due at once: never attempted (no backoff), and ready as soon as its
    query's writer's progress reaches the query."""
    owner = F.split(F.col("token"), r"\.").getItem(0)
    candidates = ledger.join(lost.select("click_id", owner.alias("owner_dc")), "click_id")
    rank = F.row_number().over(
        Window.partitionBy("click_id").orderBy((F.col("dc") != F.col("owner_dc")).cast("int"), "dc")
    )
    parts = event_id_parts("query_id")
    chosen = candidates.withColumn("rank", rank).where(F.col("rank") == 1)
    return pending_records(chosen.select(
        "dc",
        *[F.col("extra").alias("click_extra") if f.name == "click_extra" else F.col(f.name) for f in CLICK_EVENT],
        F.when(parts[0].isNotNull() & parts[1].isNotNull(), F.concat_ws(":", parts[0], parts[1])).alias("query_writer"),
        parts[2],
        F.lit(0).alias("attempts"),
        F.lit(None).alias("last_attempt_at"),
        F.lit(recovery_unit).alias("last_attempt_unit"),
        F.lit(None).alias("writer_ts_at_attempt"),
        F.lit(0).alias("writer_backfills_at_attempt"),
        F.lit(False).alias("resolved"),
    ), F.current_timestamp())


def add_pending(spark: SparkSession, path: str, rows: DataFrame) -> None:
    """Records re-injected clicks as pending (their latest record: spark_ops/pending.py), except those
    already pending in their datacenter (a repeated recovery adds none)."""
    current = pending_of(spark, path).select("dc", "click_id")
    append(rows.join(current, ["dc", "click_id"], "left_anti").select(*COLUMNS), "pending_clicks", path)


def deduplicate(spark: SparkSession, name: str, path: str, written_at: str) -> int:
    """The rows of an output table whose click_id another row also has (appended by a writer outside the
    pipeline, or by a bug) reduced to one per click_id, the earliest `written_at`, in one commit that
    replaces only those click ids' rows. Found by DuckDB over the table (no Spark job when there are none).
    Returns the rows removed."""
    with duckdb_over({name: delta_rows(name, path)}) as con:
        duplicated = [row[0] for row in con.sql(
            f"SELECT click_id FROM {name} GROUP BY click_id HAVING count(*) > 1 ORDER BY click_id").fetchall()]
        if not duplicated:
            return 0
        keys = ", ".join(sql_literal(key) for key in duplicated)
        removed = one_row(con, f"SELECT count(*) - count(DISTINCT click_id) AS n FROM {name} WHERE click_id IN ({keys})")["n"]
    rows = read_table(spark, name, path).where(F.col("click_id").isin(duplicated))
    first = Window.partitionBy("click_id").orderBy(F.col(written_at), F.col("work_unit"))
    kept = rows.withColumn("_n", F.row_number().over(first)).where(F.col("_n") == 1).drop("_n")
    overwrite_where(kept, name, path, f"click_id IN ({keys})")
    return removed


def committed_version(path: str) -> int:
    """The table's latest version; -1 before its first commit."""
    return deltalake.DeltaTable(path).version() if table_committed(path) else -1


def files_added_after(path: str, version: int) -> list[str]:
    """The data files the table's commits after `version` added, read from their commit files in its
    Delta log (the protocol's `add` actions): the cost follows those commits, not the table's size."""
    return [str(Path(path) / unquote(action["add"]["path"]))
            for number in range(version + 1, committed_version(path) + 1)
            for action in commit_actions(path, number) if "add" in action]


def unit_rows(name: str, path: str, work_unit: str, after_version: int | None, columns: list[str]) -> pa.Table:
    """The rows of `name` that `work_unit` wrote: those of the files added after `after_version` (a
    first attempt's own commits), or with None those of the whole table (a retry, whose earlier attempt
    may have written them)."""
    if not table_committed(path):
        return no_rows(name).select(columns)
    if after_version is None:
        dataset = deltalake.DeltaTable(path).to_pyarrow_dataset()
    else:
        dataset = ds.dataset(files_added_after(path, after_version), format="parquet",
                             schema=no_rows(name).schema)
    return dataset.to_table(columns=columns, filter=ds.field("work_unit") == work_unit)
