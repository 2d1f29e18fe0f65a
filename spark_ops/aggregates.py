"""Partial aggregation of joined clicks (Ubiq §4): per advertiser and event-time minute."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_ops.meter import count_commit
from spark_ops.tables import merge_into

KEYS = ["advertiser_id", "minute"]


def aggregate_clicks(joined: DataFrame) -> DataFrame:
    return joined.groupBy(
        "advertiser_id",
        F.date_trunc("minute", F.timestamp_micros("timestamp_us")).alias("minute"),
    ).agg(F.count("*").alias("clicks"), F.sum("cost_micros").alias("cost_micros"))


def refresh_aggregates(joined: DataFrame, work_unit: str, path: str) -> bool:
    """Recomputes, from `joined` (a pinned snapshot of joined_clicks), the aggregates of the
    (advertiser, minute) keys the work unit's joined clicks fall in, and merges them into the
    table at `path`. Returns whether it had any to refresh.

    Each key gets its exact value as of the snapshot, so a retry or a replay recomputes the same
    value; the other keys are untouched. Only joined_clicks files whose event times overlap the
    unit's minutes are read (Delta's file statistics), not the whole table."""
    unit_rows = joined.where(F.col("work_unit") == work_unit)
    bounds = unit_rows.agg(F.min("timestamp_us").alias("low"), F.max("timestamp_us").alias("high")).first()
    if bounds["low"] is None:
        return False
    # Every click of the minutes from the unit's first to its last (session time zone: UTC).
    minute_us = 60_000_000
    first_minute = bounds["low"] - bounds["low"] % minute_us
    after_last_minute = bounds["high"] - bounds["high"] % minute_us + minute_us
    around = joined.where((F.col("timestamp_us") >= first_minute) & (F.col("timestamp_us") < after_last_minute))
    touched = aggregate_clicks(unit_rows).select(*KEYS)
    fresh = aggregate_clicks(around).join(touched, KEYS, "left_semi")
    # The target's minutes bounded too: Delta then skips the table's files of other minutes by
    # their statistics (each refresh adds a file or two, and old minutes' files are never touched).
    condition = f"t.minute BETWEEN timestamp_micros({first_minute}) AND timestamp_micros({after_last_minute - 1})"
    condition += "".join(f" AND t.{key} = s.{key}" for key in KEYS)
    merge_into(path, fresh, f"ON {condition} WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")
    count_commit("click_aggregates")
    return True
