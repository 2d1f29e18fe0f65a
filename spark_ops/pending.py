"""Pending clicks (Photon §3.2.1): clicks whose query neither EventStore tier has yet.

A pending click is retried only when query data that could hold its query has arrived — its query's
writer's ingested progress has passed the query's timestamp since the last lookup, or a work unit
has since brought lines of that writer at or behind its progress (a backfill: the query may sit in a
file the dispatcher reached late) — and no sooner than an exponential backoff after its last attempt.
A click whose query is never logged is thus not looked up again while its writer logs on in order.
Once it is `unjoinable_after` behind the query stream's progress (event time) and has been looked
up `min_attempts` times, it is given up as unjoinable. One trigger says when a retry could join
something (`pending_retry`): a click pass then retries the pending clicks that are due along with
its new clicks (spark_ops/click_pass.py), and the pending-click dispatcher requests a retry run of
their own (sensors/dispatcher.py) for when no click run comes.

`pending_clicks` is a log of records, appended to and never updated in a pass: a click run appends
a record for each click it leaves pending and a resolved record for each pending click it retried
that is no longer pending (a MERGE would cost ~2 s a pass). A click's latest record says where it
stands (`current_pending`); table maintenance rewrites the log down to the current records.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import deltalake
import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from resources.event_store.progress import QueryProgress, known_query_progress
from resources.state.layout import DataLayout
from resources.state.sidecars import Document
from spark_ops.query_tiers import event_id_parts
from spark_ops.handoff import unstage
from spark_ops.schemas import arrow_schema
from spark_ops.tables import (TABLE_SCHEMAS, append, overwrite_where, read_table, rows_held, sql_literal,
                              table_committed, table_lock)

if TYPE_CHECKING:  # for the annotation only: the settings are a Dagster resource, and spark_ops runs without Dagster
    from resources.settings import PipelineSettings

PROGRESS_SCHEMA = T.StructType(
    [
        T.StructField("query_writer", T.StringType()),
        T.StructField("writer_ts", T.LongType()),
        T.StructField("writer_backfills", T.IntegerType()),
    ]
)
COLUMNS = TABLE_SCHEMAS["pending_clicks"][0].fieldNames()
STREAM_PROGRESS = "stream_progress_ts"  # the column of the query stream's progress (run_values)

# The pending rule, written once in SQL that Spark (F.expr) and DuckDB both evaluate, and Python
# through DuckDB (pending_retry_decision): which record of a click is its latest, and when a click has
# reached the unjoinable age.
LATEST_SQL = "row_number() OVER (PARTITION BY dc, click_id ORDER BY recorded_at DESC, resolved DESC) = 1"


def age_reached_sql(progress_ts: int | str | None, unjoinable_after_seconds: float, event_ts: str = "timestamp_us") -> str:
    """SQL: the click at `event_ts` is `unjoinable_after_seconds` or more behind the query stream's
    progress (event time; a value, or a column holding it). Never, while the stream has no progress."""
    if progress_ts is None:
        return "FALSE"
    progress = progress_ts if isinstance(progress_ts, str) else str(int(progress_ts))
    return f"{progress} - {event_ts} >= {int(unjoinable_after_seconds * 1e6)}"


_evaluator = threading.local()  # a DuckDB connection per thread: opening one costs ~40 ms


def evaluate(condition_sql: str) -> bool:
    """A condition of the rule on literal values, in Python (by an in-memory DuckDB: well under a
    millisecond once the thread's connection is open)."""
    if not hasattr(_evaluator, "con"):
        _evaluator.con = duckdb.connect()
    return bool(_evaluator.con.execute(f"SELECT {condition_sql}").fetchone()[0])


@dataclass
class PendingDigest(Document):
    """What a datacenter's pending clicks wait for, summarised when the last click run finished (a
    document of resources/state/sidecars.py, read by the dispatchers on every tick): per query
    writer, the smallest query timestamp not yet covered and the writer's backfills then; the oldest
    pending click (for the unjoinable age); and when clicks that could be joined now leave their
    retry backoff."""

    pending: int = 0
    # writer -> [smallest query timestamp a pending click needs beyond that writer's progress, the
    # writer's backfills when those clicks were last looked up]
    needs: dict[str, list] = field(default_factory=dict)
    oldest_ts: int | None = None  # oldest pending click (event time)
    retry_at: float | None = None  # when clicks joinable with the data present leave their backoff
    stream_ts: int = 0  # the query stream's progress the digest was made with
    updated_at: float = 0.0


@dataclass(frozen=True)
class RetryDecision:
    ready: bool
    reason: str
    wait_until: float | None = None  # a retry will be due then, with the data present


def pending_retry_decision(
    digest: PendingDigest, progress: QueryProgress, unjoinable_after_seconds: float, now: float | None = None
) -> RetryDecision:
    """Whether a pending-click retry could join (or finally give up on) a click now. Retries happen
    only when query data that could hold a pending click's query has arrived, no sooner than the
    clicks' backoff allows; never in a loop while no query data arrives."""
    now = time.time() if now is None else now
    if digest.pending == 0:
        return RetryDecision(False, "no pending clicks")
    for writer, (needed_ts, backfills) in digest.needs.items():
        known = progress.writers.get(writer)
        if known is not None and ((needed_ts is not None and known.max_ts >= needed_ts) or known.backfills > backfills):
            return RetryDecision(True, f"query writer {writer} has new data for pending clicks")
    # Clicks that had reached the age when the digest was made are covered by retry_at.
    stream_ts = progress.max_ts
    if (digest.oldest_ts is not None and stream_ts is not None and stream_ts > digest.stream_ts
            and evaluate(age_reached_sql(stream_ts, unjoinable_after_seconds, str(int(digest.oldest_ts))))):
        return RetryDecision(True, "pending clicks reached the unjoinable age")
    if digest.retry_at is not None:
        if now >= digest.retry_at:
            return RetryDecision(True, "pending clicks left their retry backoff")
        return RetryDecision(False, f"pending clicks in retry backoff for {digest.retry_at - now:.1f} s more",
                             wait_until=digest.retry_at)
    return RetryDecision(False, f"{digest.pending} pending click(s) wait for query data that could hold their queries")


def pending_retry(layout: DataLayout, dc: str, settings: PipelineSettings) -> RetryDecision:
    """The one retry trigger of `dc`'s pending clicks (pending_retry_decision), by the digest the last
    click run left and the query stream's progress as known (known_query_progress): asked by each
    click pass, to retry them along with its new clicks, and by the pending-click dispatcher, to
    request a retry run of their own."""
    return pending_retry_decision(
        PendingDigest.load(layout.pending_digest_file(dc)),
        known_query_progress(*layout.query_progress_files(dc)),
        settings.unjoinable_after_seconds,
    )


def current_pending(records: DataFrame) -> DataFrame:
    """The clicks still pending: each click's latest record (per datacenter), if not resolved."""
    return records.withColumn("_latest", F.expr(LATEST_SQL)).where(F.col("_latest") & ~F.col("resolved")).drop("_latest")


def pending_of(spark: SparkSession, path: str, dc: str | None = None) -> DataFrame:
    """The current pending clicks in the table at `path` (of one datacenter, or all)."""
    records = read_table(spark, "pending_clicks", path)
    return current_pending(records if dc is None else records.where(F.col("dc") == dc))


# The current pending clicks (as current_pending), from a relation `records` of pending_clicks rows
# (one datacenter's or all), in DuckDB.
CURRENT_SQL = f"""
    SELECT * EXCLUDE (latest) FROM (SELECT *, {LATEST_SQL} AS latest FROM records)
    WHERE latest AND NOT resolved"""


@dataclass
class PendingPolicy:
    progress: QueryProgress  # read before the EventStore's tables, so it never claims more than they hold
    unjoinable_after_seconds: float
    min_attempts: int
    backoff_seconds: float
    backoff_max_seconds: float

    def progress_table(self) -> pa.Table:
        """The query stream's progress, a row per writer (PROGRESS_SCHEMA)."""
        rows = [(name, w.max_ts, w.backfills) for name, w in self.progress.writers.items()]
        return pa.Table.from_pylist([dict(zip(PROGRESS_SCHEMA.fieldNames(), row)) for row in rows],
                                    schema=arrow_schema(PROGRESS_SCHEMA))

    def run_values(self) -> dict[str, int | None]:
        """The values `judge` reads from its frame, a column each (spark_ops/registry_calls.py: lookup_clicks)."""
        return {STREAM_PROGRESS: self.progress.max_ts}

    def _age_reached(self) -> Column:
        progress = None if self.progress.max_ts is None else STREAM_PROGRESS
        return F.expr(age_reached_sql(progress, self.unjoinable_after_seconds))

    def _ready(self, path: str, dc: str) -> duckdb.DuckDBPyRelation | None:
        """The datacenter's current pending clicks with `data_ready` (query data that could hold the
        click's query arrived since its last lookup, or the click reached the unjoinable age: its
        final lookup is due) and `backoff_over_at` (epoch seconds; never attempted, re-injected by
        recovery: no backoff). Read by DuckDB from the Delta table's files (deltalake): tens of
        milliseconds, where Spark's window over the records costs a few jobs. None: no table yet."""
        if not table_committed(path):
            return None
        con = duckdb.connect()
        con.register("records", deltalake.DeltaTable(path).to_pyarrow_dataset().filter(ds.field("dc") == dc))
        con.register("progress", self.progress_table())
        con.execute(f"CREATE TEMP VIEW current AS {CURRENT_SQL}")
        age = age_reached_sql(self.progress.max_ts, self.unjoinable_after_seconds)
        return con.sql(f"""
            SELECT c.*,
                (p.writer_ts IS NOT NULL AND p.writer_ts >= c.query_ts
                    AND coalesce(c.writer_ts_at_attempt, -1) < c.query_ts)
                OR coalesce(p.writer_backfills, 0) > c.writer_backfills_at_attempt
                OR ({age}) AS data_ready,
                coalesce(epoch(c.last_attempt_at) + least({float(self.backoff_max_seconds)},
                    {float(self.backoff_seconds)} * pow(2.0, c.attempts - 1)), 0.0) AS backoff_over_at
            FROM current c LEFT JOIN progress p USING (query_writer)""")

    def due(self, spark: SparkSession, path: str, dc: str, staging: Path, now: float | None = None) -> DataFrame | None:
        """The datacenter's current pending clicks to retry now (the table's columns), handed to Spark
        through Parquet at `staging`; None if there is none."""
        now = time.time() if now is None else now
        ready = self._ready(path, dc)
        if ready is None:
            return None
        due = ready.filter(f"data_ready AND backoff_over_at <= {float(now)}").select(", ".join(COLUMNS)).to_arrow_table()
        if not due.num_rows:
            return None
        schema = TABLE_SCHEMAS["pending_clicks"][0]
        frame = unstage(spark, pa.RecordBatchReader.from_batches(due.schema, due.to_batches()), staging)
        return frame.select(*[F.col(f.name).cast(f.dataType) for f in schema.fields])


    def judge(self, not_found: DataFrame, token: str) -> DataFrame:
        """Clicks not found by this lookup, as `pending_clicks` records for it (but the times, which
        `record_pending` sets), with `give_up` and the unjoinable `reason`. `not_found` carries the
        clicks' earlier `attempts` (0 if none), the unit of their last attempt (an earlier attempt
        of this very work unit counted the lookup), `memory_vouched_ts` (null unless the memory tier
        vouched for the miss: the writer's time it was fed to), its query's writer and that writer's
        progress (`query_writer`, `writer_ts`, `writer_backfills`: `progress_table()`'s row, added by
        the lookup, spark_ops/registry_calls.py) and `run_values()`."""
        counted = F.coalesce(F.col("last_attempt_unit"), F.lit("")) != token
        attempts = F.col("attempts") + F.when(counted, 1).otherwise(0)
        with_writer = not_found.withColumn("attempts", attempts.cast("int")).drop("last_attempt_unit").select(
            "*", event_id_parts("query_id")[2])
        behind = F.coalesce(F.col(STREAM_PROGRESS), F.lit(0)) - F.col("timestamp_us")
        return (
            with_writer
            # The writer's time this lookup covered: its ingested progress, or the time the query tailer
            # had fed the memory tier to where that tier vouched for the miss (spark_ops/join.py).
            .withColumn("writer_ts_at_attempt", F.greatest("writer_ts", "memory_vouched_ts"))
            .withColumn("writer_backfills_at_attempt", F.coalesce(F.col("writer_backfills"), F.lit(0)).cast("int"))
            .withColumn("last_attempt_unit", F.lit(token))
            .withColumn("give_up", self._age_reached() & (F.col("attempts") >= self.min_attempts))
            .withColumn(
                "reason",
                F.format_string(
                    "query not found in %d lookups; click %.0f s behind the query stream",
                    F.col("attempts"), behind / 1e6,
                ),
            )
        )

    def digest(self, path: str, dc: str) -> PendingDigest:
        """What this datacenter's pending clicks now wait for (PendingDigest)."""
        ready = self._ready(path, dc)
        if ready is None:
            return PendingDigest(stream_ts=self.progress.max_ts or 0, updated_at=time.time())
        waiting = "NOT data_ready AND query_writer IS NOT NULL"
        behind_progress = "coalesce(writer_ts_at_attempt, -1) < query_ts"
        # One pass over the clicks: a row per query writer (and one for clicks without a writer).
        per_writer = ready.aggregate(f"""
            query_writer, count(*) AS pending, min(timestamp_us) AS oldest_ts,
            min(backoff_over_at) FILTER (WHERE data_ready) AS retry_at,
            count(*) FILTER (WHERE {waiting}) AS waiting,
            min(query_ts) FILTER (WHERE {waiting} AND {behind_progress}) AS ts,
            min(writer_backfills_at_attempt) FILTER (WHERE {waiting}) AS backfills""", "query_writer").to_arrow_table()
        rows = per_writer.to_pylist()

        def smallest(column: str):
            return min((r[column] for r in rows if r[column] is not None), default=None)

        return PendingDigest(
            pending=sum(r["pending"] for r in rows),
            needs={r["query_writer"]: [r["ts"], r["backfills"]] for r in rows if r["waiting"]},
            oldest_ts=smallest("oldest_ts"),
            retry_at=smallest("retry_at"),
            stream_ts=self.progress.max_ts or 0,
            updated_at=time.time(),
        )


def pending_records(rows: DataFrame, recorded_at: Column) -> DataFrame:
    """`pending_clicks` records (the table's columns) of `rows`, which hold every other column,
    recorded at `recorded_at`: the one definition of a record. Its last attempt: a record a lookup
    leaves pending (attempts > 0) is that lookup's; a resolved one keeps its click's last; a click
    never looked up (re-injected by recovery: spark_ops/verification.py) has none, so no backoff
    holds it."""
    last_attempt = F.when(F.col("resolved"), F.col("last_attempt_at")).when(F.col("attempts") > 0, recorded_at)
    rows = rows.withColumn("recorded_at", recorded_at).withColumn("last_attempt_at", last_attempt)
    return rows.select(*[F.col(f.name).cast(f.dataType) for f in TABLE_SCHEMAS["pending_clicks"][0].fields])


def record_pending(path: str, dc: str, still_pending: DataFrame, resolved: DataFrame | None) -> None:
    """Records a lookup in `pending_clicks`, in one append: a record for each click still pending
    (`still_pending`: the judged clicks), and a resolved record for each retried click that is not
    pending any more (`resolved`: those retried clicks, the table's columns; joined, unjoinable, or
    registered by another work unit). Both carry `decided_at_us`, when the registry answered for the
    click in this lookup (spark_ops/registry_calls.py: commit_ids), which dates the records: later
    than any record of an earlier lookup. Appended again by a retried work unit, the records say the
    same and are later: a click's latest record counts."""
    # The times are set by pending_records, once both kinds of record are in.
    rows = (still_pending.withColumn("dc", F.lit(dc)).withColumn("resolved", F.lit(False))
            .withColumn("last_attempt_at", F.lit(None).cast("timestamp")).withColumn("recorded_at", F.lit(None).cast("timestamp"))
            .select(*COLUMNS, "decided_at_us"))
    if resolved is not None:
        rows = rows.unionByName(resolved.withColumn("resolved", F.lit(True)).select(*COLUMNS, "decided_at_us"))
    append(pending_records(rows, F.timestamp_micros(F.col("decided_at_us"))), "pending_clicks", path)


def compact_pending(spark: SparkSession, path: str, dc: str) -> tuple[int, int]:
    """Rewrites a datacenter's records down to its current pending clicks, in one Spark job, under
    the table's lock (nothing is appended meanwhile). Returns the records before and after, from the
    Delta log's file statistics: counting them with Spark, and caching the current ones to count them
    before the overwrite, took two more jobs (a compaction held click runs' appends for ~10 s in a
    live run at 1,000 clicks/s)."""
    partition = f"dc = {sql_literal(dc)}"

    def held() -> int:
        rows = rows_held(path, dc=dc)
        return read_table(spark, "pending_clicks", path).where(partition).count() if rows is None else rows

    with table_lock(path):  # before the read: an append meanwhile would be overwritten unread
        records = read_table(spark, "pending_clicks", path).where(partition)
        before = held()
        if before == 0:
            return 0, 0
        # Delta reads the version the overwrite replaces: the files it removes are read before its commit.
        overwrite_where(current_pending(records).select(*COLUMNS), "pending_clicks", path, partition)
        after = held()
    return before, after
