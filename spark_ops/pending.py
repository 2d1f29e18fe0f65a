"""Pending clicks (Photon §3.2.1): clicks whose query neither EventStore tier has yet.

A pending click is retried only when query data that could hold its query has arrived — its query's
writer's ingested progress has passed the query's timestamp since the last lookup, or a work unit
has since brought lines of that writer at or behind its progress (a backfill: the query may sit in a
file the dispatcher reached late) — and no sooner than an exponential backoff after its last attempt.
A click whose query is never logged is thus not looked up again while its writer logs on in order.
Once it is `unjoinable_after` behind the query stream's progress (event time) and has been looked
up `min_attempts` times, it is given up as unjoinable. A click run retries the pending clicks that
are due along with its new clicks (photon_assets/clicks.py); a retry run of their own is for when
no click run comes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from resources.stream_state import PendingDigest, QueryProgress
from spark_ops.event_store import event_id_parts
from spark_ops.meter import count_commit
from spark_ops.schemas import literal_frame
from spark_ops.tables import TABLE_SCHEMAS, ensure_table, merge_into, read_table, sql_literal, table_lock

PROGRESS_SCHEMA = T.StructType(
    [
        T.StructField("query_writer", T.StringType()),
        T.StructField("writer_ts", T.LongType()),
        T.StructField("writer_backfills", T.IntegerType()),
    ]
)


@dataclass
class PendingPolicy:
    progress: QueryProgress  # read before the EventStore's tables, so it never claims more than they hold
    unjoinable_after_seconds: float
    min_attempts: int
    backoff_seconds: float
    backoff_max_seconds: float

    def _progress_frame(self, spark: SparkSession) -> DataFrame:
        rows = [(name, w.max_ts, w.backfills) for name, w in self.progress.writers.items()]
        return literal_frame(spark, rows, PROGRESS_SCHEMA)

    def _age_reached(self, timestamp_us: Column) -> Column:
        if self.progress.max_ts is None:
            return F.lit(False)
        return F.lit(self.progress.max_ts) - timestamp_us >= int(self.unjoinable_after_seconds * 1e6)

    def _backoff_over_at(self) -> Column:
        seconds = F.least(
            F.lit(self.backoff_max_seconds), F.lit(self.backoff_seconds) * F.pow(F.lit(2.0), F.col("attempts") - 1)
        )
        # Never attempted (re-injected by recovery): no backoff.
        return F.coalesce(F.col("last_attempt_at").cast("double") + seconds, F.lit(0.0))

    def _with_data_ready(self, pending: DataFrame) -> DataFrame:
        """`data_ready`: query data that could hold the click's query arrived since its last lookup,
        or the click reached the unjoinable age (its final lookup is due)."""
        writer_passed = (
            F.col("writer_ts").isNotNull()
            & (F.col("writer_ts") >= F.col("query_ts"))
            & (F.coalesce(F.col("writer_ts_at_attempt"), F.lit(-1)) < F.col("query_ts"))
        )
        backfilled = F.coalesce(F.col("writer_backfills"), F.lit(0)) > F.col("writer_backfills_at_attempt")
        return pending.join(self._progress_frame(pending.sparkSession), "query_writer", "left").withColumn(
            "data_ready", writer_passed | backfilled | self._age_reached(F.col("timestamp_us"))
        )

    def due(self, pending: DataFrame, now: float | None = None) -> DataFrame:
        """The pending clicks to retry now (the table's columns)."""
        now = time.time() if now is None else now
        ready = self._with_data_ready(pending).where(F.col("data_ready") & (self._backoff_over_at() <= now))
        return ready.select(*pending.columns)

    def judge(self, not_found: DataFrame, token: str) -> DataFrame:
        """Clicks not found by this lookup, as `pending_clicks` rows for it, with `give_up` and the
        unjoinable `reason`. `not_found` carries the clicks' earlier `attempts` (0 if none)."""
        attempts = F.col("attempts") + 1
        parts = event_id_parts("query_id")
        with_writer = not_found.withColumn("attempts", attempts.cast("int")).select(
            "*",
            F.when(parts[0].isNotNull() & parts[1].isNotNull(), F.concat_ws(":", parts[0], parts[1])).alias("query_writer"),
            parts[2],
        )
        behind = F.lit(self.progress.max_ts or 0) - F.col("timestamp_us")
        return (
            with_writer.join(self._progress_frame(not_found.sparkSession), "query_writer", "left")
            .withColumn("writer_ts_at_attempt", F.col("writer_ts"))
            .withColumn("writer_backfills_at_attempt", F.coalesce(F.col("writer_backfills"), F.lit(0)).cast("int"))
            .withColumn("last_attempt_at", F.current_timestamp())
            .withColumn("last_attempt_unit", F.lit(token))
            .withColumn("give_up", self._age_reached(F.col("timestamp_us")) & (F.col("attempts") >= self.min_attempts))
            .withColumn(
                "reason",
                F.format_string(
                    "query not found in %d lookups; click %.0f s behind the query stream",
                    F.col("attempts"), behind / 1e6,
                ),
            )
            .drop("writer_ts", "writer_backfills")
        )

    def digest(self, spark: SparkSession, path: str, dc: str) -> PendingDigest:
        """What this datacenter's pending clicks now wait for (resources/stream_state.py)."""
        rows = self._with_data_ready(read_table(spark, "pending_clicks", path).where(F.col("dc") == dc))
        waiting = ~F.col("data_ready") & F.col("query_writer").isNotNull()
        behind_progress = F.coalesce(F.col("writer_ts_at_attempt"), F.lit(-1)) < F.col("query_ts")
        # One pass over the table: a row per query writer (and one for clicks without a writer).
        per_writer = rows.groupBy("query_writer").agg(
            F.count("*").alias("pending"),
            F.min("timestamp_us").alias("oldest_ts"),
            F.min(F.when(F.col("data_ready"), self._backoff_over_at())).alias("retry_at"),
            F.count_if(waiting).alias("waiting"),
            F.min(F.when(waiting & behind_progress, F.col("query_ts"))).alias("ts"),
            F.min(F.when(waiting, F.col("writer_backfills_at_attempt"))).alias("backfills"),
        ).collect()

        def smallest(column: str):
            return min((r[column] for r in per_writer if r[column] is not None), default=None)

        return PendingDigest(
            pending=sum(r["pending"] for r in per_writer),
            needs={r["query_writer"]: [r["ts"], r["backfills"]] for r in per_writer if r["waiting"]},
            oldest_ts=smallest("oldest_ts"),
            retry_at=smallest("retry_at"),
            stream_ts=self.progress.max_ts or 0,
            updated_at=time.time(),
        )


def update_pending(path: str, dc: str, token: str, still_pending: DataFrame, attempted: DataFrame | None) -> None:
    """Records this lookup in `pending_clicks`: clicks still pending are inserted or have their
    attempt counted (once per work unit, so a retried work unit counts once); `attempted` clicks
    that are no longer pending (joined, registered elsewhere, unjoinable) leave the table."""
    spark = still_pending.sparkSession
    ensure_table(spark, "pending_clicks", path)
    columns = TABLE_SCHEMAS["pending_clicks"][0].fieldNames()
    rows = still_pending.withColumn("dc", F.lit(dc)).select(*columns).withColumn("still_pending", F.lit(True))
    if attempted is not None:
        gone = attempted.select("click_id").join(rows.select("click_id"), "click_id", "left_anti")
        rows = rows.unionByName(gone.withColumn("still_pending", F.lit(False)), allowMissingColumns=True)
    with table_lock(path):
        updated = ", ".join(f"{c} = s.{c}" for c in columns if c not in ("dc", "click_id", "attempts"))
        merge_into(
            path, rows,
            f"ON t.dc = {sql_literal(dc)} AND t.click_id = s.click_id"
            " WHEN MATCHED AND NOT s.still_pending THEN DELETE"
            f" WHEN MATCHED AND s.still_pending AND t.last_attempt_unit <> {sql_literal(token)}"
            f" THEN UPDATE SET {updated}, attempts = greatest(t.attempts, s.attempts)"
            f" WHEN NOT MATCHED AND s.still_pending THEN INSERT ({', '.join(columns)})"
            f" VALUES ({', '.join(f's.{c}' for c in columns)})",
        )
    count_commit("pending_clicks")
