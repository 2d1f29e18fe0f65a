"""Verification and recovery (Photon §3.3.3) as Spark transformations.

An id in the registry whose output is not in `joined_clicks` or `unjoinable_clicks` is lost once no
work unit that could still write it is in flight: its token belongs to a work unit that finished
(succeeded, or failed for good), or its token was cleared and the output has gone since (storage
loss). Recovery unregisters such ids and re-injects their clicks as pending clicks, so that the
pending retries join them again, exactly once.

Storage loss: a data file a Delta table still references but that is gone makes every read of the
table fail. `repair_table` rewrites the table from the files that remain; the rows lost with the file
then show up here as lost ids.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

import deltalake
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from spark_ops.event_store import event_id_parts
from spark_ops.pending import COLUMNS, pending_of
from spark_ops.tables import CLICK_EVENT, append, ensure_table, overwrite, table_lock

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
    ensure_table(spark, name, path)
    with table_lock(path):
        missing = missing_data_files(path)
        if missing:
            spark.conf.set("spark.sql.files.ignoreMissingFiles", "true")
            try:
                overwrite(spark.read.format("delta").load(path), name, path)
            finally:
                spark.conf.unset("spark.sql.files.ignoreMissingFiles")
    return len(missing)


def settled(in_flight: list[str]) -> Column:
    """Whether a registered id's work unit (its `token`) is not in flight: its output must be there."""
    return F.col("token").isNull() | ~F.col("token").isin(in_flight)


def registry_outcomes(registered: DataFrame, joined: DataFrame, unjoinable: DataFrame, in_flight: list[str]) -> DataFrame:
    """Registered ids (click_id, timestamp_us, token), each with `lost`: no output, and its work unit
    is not in flight; and `confirmed`: its output is there, and a finished work unit's token still
    holds it (a work unit that wrote its output but died before clearing its tokens). `in_flight`
    must be read after the registry was scanned, so that a work unit that registered ids after it was
    read cannot look finished."""
    resolved = (joined.select("click_id").unionByName(unjoinable.select("click_id")).distinct()
                .withColumn("has_output", F.lit(True)))
    has_output = F.col("has_output").isNotNull()
    done = settled(in_flight)
    return registered.join(resolved, "click_id", "left").select(
        *registered.columns, (done & ~has_output).alias("lost"),
        (F.col("token").isNotNull() & done & has_output).alias("confirmed"),
    )


def unresolved_ids(registered: DataFrame, joined: DataFrame, unjoinable: DataFrame, in_flight: list[str]) -> DataFrame:
    """Registered ids (click_id, timestamp_us, token) that are lost (registry_outcomes)."""
    return registry_outcomes(registered, joined, unjoinable, in_flight).where("lost").select(*registered.columns)


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


def confirmed_tokens(registered: DataFrame, joined: DataFrame, unjoinable: DataFrame, in_flight: list[str]) -> DataFrame:
    """Tokens (one column `token`) that still hold confirmed ids (registry_outcomes)."""
    return registry_outcomes(registered, joined, unjoinable, in_flight).where("confirmed").select("token").distinct()


def reinjected_clicks(lost: DataFrame, ledger: DataFrame, recovery_unit: str) -> DataFrame:
    """`pending_clicks` rows for lost ids, from the click ledger: one per click, in the datacenter
    whose work unit registered it if that one read it, else any datacenter that did. Due at once:
    never attempted (no backoff), and ready as soon as its query's writer's progress reaches the query."""
    owner = F.split(F.col("token"), r"\.").getItem(0)
    candidates = ledger.join(lost.select("click_id", owner.alias("owner_dc")), "click_id")
    rank = F.row_number().over(
        Window.partitionBy("click_id").orderBy((F.col("dc") != F.col("owner_dc")).cast("int"), "dc")
    )
    parts = event_id_parts("query_id")
    chosen = candidates.withColumn("rank", rank).where(F.col("rank") == 1)
    return chosen.select(
        "dc",
        *[F.col("extra").alias("click_extra") if f.name == "click_extra" else F.col(f.name) for f in CLICK_EVENT],
        F.when(parts[0].isNotNull() & parts[1].isNotNull(), F.concat_ws(":", parts[0], parts[1])).alias("query_writer"),
        parts[2],
        F.lit(0).cast("int").alias("attempts"),
        F.lit(None).cast("timestamp").alias("last_attempt_at"),
        F.lit(recovery_unit).alias("last_attempt_unit"),
        F.lit(None).cast("long").alias("writer_ts_at_attempt"),
        F.lit(0).cast("int").alias("writer_backfills_at_attempt"),
        F.lit(False).alias("resolved"),
        F.current_timestamp().alias("recorded_at"),
    )


def add_pending(spark: SparkSession, path: str, rows: DataFrame) -> None:
    """Records re-injected clicks as pending (their latest record: spark_ops/pending.py), except those
    already pending in their datacenter (a repeated recovery adds none)."""
    current = pending_of(spark, path).select("dc", "click_id")
    append(rows.join(current, ["dc", "click_id"], "left_anti").select(*COLUMNS), "pending_clicks", path)
