"""Partial aggregation of joined clicks (Ubiq §4): per advertiser and event-time minute.

`click_aggregates` is refreshed off the click path, by a run of its own every so often: from a pinned
snapshot of `joined_clicks` (version V), it recomputes exactly the (advertiser, minute) keys of the
rows that changed since the version it last refreshed through (Delta's change data feed), and
records V with its commit (the commit's `userMetadata`). So the table always equals the aggregation
of `joined_clicks` at the version its last commit names, which is what the asset check compares.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.errors import PySparkException

from spark_ops.meter import count_commit
from spark_ops.tables import delta_path, ensure_table, latest_snapshot, merge_into, overwrite, table_lock

KEYS = ["advertiser_id", "minute"]
VERSION_NOTE = "joined_clicks_version="
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


def aggregate_clicks(joined: DataFrame) -> DataFrame:
    return joined.groupBy(
        "advertiser_id",
        F.date_trunc("minute", F.timestamp_micros("timestamp_us")).alias("minute"),
    ).agg(F.count("*").alias("clicks"), F.sum("cost_micros").alias("cost_micros"))


@contextmanager
def commit_note(spark: SparkSession, note: str) -> Iterator[None]:
    """The session's Delta commits inside the block carry `note` as their userMetadata."""
    spark.conf.set(USER_METADATA, note)
    try:
        yield
    finally:
        spark.conf.unset(USER_METADATA)


def aggregates_snapshot(spark: SparkSession, aggregates_path: str) -> tuple[int | None, DataFrame]:
    """click_aggregates pinned to its latest version, and the joined_clicks version it equals the
    aggregation of: the one its latest refresh noted (None: never refreshed)."""
    ensure_table(spark, "click_aggregates", aggregates_path)
    history = spark.sql(f"DESCRIBE HISTORY {delta_path(aggregates_path)}").select("version", "userMetadata").collect()
    latest = max(row["version"] for row in history)
    noted = [row for row in history if (row["userMetadata"] or "").startswith(VERSION_NOTE)]
    through = int(max(noted, key=lambda row: row["version"])["userMetadata"][len(VERSION_NOTE):]) if noted else None
    return through, spark.read.format("delta").option("versionAsOf", latest).load(aggregates_path)


def refreshed_through(spark: SparkSession, aggregates_path: str) -> int | None:
    """The joined_clicks version click_aggregates equals the aggregation of (None: never refreshed)."""
    return aggregates_snapshot(spark, aggregates_path)[0]


def _changed_keys(spark: SparkSession, joined_path: str, after: int, through: int) -> tuple[DataFrame, dict] | None:
    """The (advertiser, minute) keys of the rows added to or removed from joined_clicks in versions
    (after, through], and the event-time bounds of those rows; None when the change feed cannot tell
    (not enabled on the table, or its files vacuumed by table maintenance): then everything is
    recomputed, which is always right."""
    changes = (spark.read.format("delta").option("readChangeFeed", "true")
               .option("startingVersion", after + 1).option("endingVersion", through).load(joined_path))
    try:
        bounds = changes.agg(F.min("timestamp_us").alias("low"), F.max("timestamp_us").alias("high")).first()
    except PySparkException:
        return None
    return aggregate_clicks(changes).select(*KEYS).distinct(), bounds.asDict()


def refresh_aggregates(spark: SparkSession, joined_path: str, aggregates_path: str, full: bool = False) -> dict:
    """Brings click_aggregates up to joined_clicks' latest version: the keys changed since its last
    refresh, recomputed from the pinned snapshot, or everything (`full`, a first refresh, or a change
    feed that cannot tell). Under the table's lock: refreshes commit in snapshot order, so none
    replaces a key's value with an older one. Returns what it did."""
    ensure_table(spark, "click_aggregates", aggregates_path)
    with table_lock(aggregates_path):
        version, snapshot = latest_snapshot(spark, "joined_clicks", joined_path)
        since = None if full else refreshed_through(spark, aggregates_path)
        done = {"joined_clicks_version": version, "since_version": since}
        if since is not None and since >= version:
            return {**done, "refreshed": "none"}
        changed = None if since is None else _changed_keys(spark, joined_path, since, version)
        with commit_note(spark, f"{VERSION_NOTE}{version}"):
            if changed is None:
                overwrite(aggregate_clicks(snapshot), "click_aggregates", aggregates_path)
                return {**done, "refreshed": "all"}
            touched, bounds = changed
            if bounds["low"] is None:
                # Versions without row changes (table maintenance): the aggregates still equal them.
                return {**done, "refreshed": "none"}
            _merge_keys(snapshot, touched, bounds, aggregates_path)
    return {**done, "refreshed": "changes"}


def _merge_keys(snapshot: DataFrame, touched: DataFrame, bounds: dict, path: str) -> None:
    """Recomputes the touched keys from `snapshot` and merges them in; a key no row holds any more is
    deleted. Only snapshot files whose event times overlap the changed minutes are read (Delta's file
    statistics), and only the target's files of those minutes."""
    minute_us = 60_000_000
    first_minute = bounds["low"] - bounds["low"] % minute_us
    after_last_minute = bounds["high"] - bounds["high"] % minute_us + minute_us
    around = snapshot.where((F.col("timestamp_us") >= first_minute) & (F.col("timestamp_us") < after_last_minute))
    fresh = touched.join(aggregate_clicks(around), KEYS, "left")
    condition = f"t.minute BETWEEN timestamp_micros({first_minute}) AND timestamp_micros({after_last_minute - 1})"
    condition += "".join(f" AND t.{key} = s.{key}" for key in KEYS)
    merge_into(path, fresh, f"ON {condition} WHEN MATCHED AND s.clicks IS NULL THEN DELETE "
                            "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED AND s.clicks IS NOT NULL THEN INSERT *")
    count_commit("click_aggregates")
