"""Partial aggregation of joined clicks (Ubiq §4): per advertiser and event-time minute.

`click_aggregates` is refreshed off the click path, by a run of its own every so often. It always
equals the aggregation of `joined_clicks` at the version its latest commit names (the commit's
`userMetadata`), which is what the asset check compares. A refresh reads the rows added to (or
removed from) `joined_clicks` since that version from Delta's change data feed, and adds their
counts to the aggregates of their minutes: the minutes they span are rewritten in one commit that
names the new version. It reads the change feed and the touched minutes' aggregates with deltalake
in the driver (tens of thousands of rows: no Spark job), and writes with Spark. A first refresh, a
full one (`verify`), or one whose change feed is gone (vacuumed) recomputes everything from a pinned
snapshot instead, which is always right. A refresh publishes no click twice: a click id the versions it
would add repeat (among themselves or from before) stops it with ClicksJoinedTwice, whether or not the
checks have run on those versions yet (photon_assets/checks.py).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import deltalake
import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_ops.tables import (TABLE_SCHEMAS, delta_rows, duckdb_over, ensure_table, latest_snapshot, no_rows, one_row,
                              overwrite, overwrite_where, table_committed, table_lock)

KEYS = ["advertiser_id", "minute"]
VERSION_NOTE = "joined_clicks_version="
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
MINUTE_US = 60_000_000
# How each kind of change-feed row counts.
SIGNS = {"insert": 1, "update_postimage": 1, "delete": -1, "update_preimage": -1}


def aggregate_clicks(joined: DataFrame) -> DataFrame:
    return joined.groupBy(
        "advertiser_id",
        F.date_trunc("minute", F.timestamp_micros("timestamp_us")).alias("minute"),
    ).agg(F.count("*").alias("clicks"), F.sum("cost_micros").alias("cost_micros"))


# Refreshes commit once each; other commits are rare (verify's full refresh, another writer).
NOTE_SEARCH_COMMITS = 100


@contextmanager
def commit_note(spark: SparkSession, note: str) -> Iterator[None]:
    """The session's Delta commits inside the block carry `note` as their userMetadata."""
    spark.conf.set(USER_METADATA, note)
    try:
        yield
    finally:
        spark.conf.unset(USER_METADATA)


def compared_with_joined(aggregates_path: str, joined_path: str) -> dict:
    """click_aggregates at its latest version against the aggregation of joined_clicks at the version
    its latest refresh names (none named: of no rows), computed apart from the refresh's, by DuckDB
    over the tables as deltalake reads them (no Spark job). Returns `mismatched_keys`, `rows` and
    `clicks` of click_aggregates, and `joined_clicks_version` (None: none named)."""
    through, version = refreshed_through(aggregates_path) if table_committed(aggregates_path) else (None, None)
    joined = no_rows("joined_clicks") if through is None else delta_rows("joined_clicks", joined_path, through)
    with duckdb_over({"actual": delta_rows("click_aggregates", aggregates_path, version), "joined": joined}) as con:
        counts = one_row(con, """
            WITH expected AS (
                SELECT advertiser_id, epoch_us(date_trunc('minute', make_timestamp(timestamp_us))) AS minute_us,
                       count(*) AS clicks, sum(cost_micros) AS cost_micros
                FROM joined GROUP BY ALL),
            actual AS (SELECT advertiser_id, epoch_us(minute) AS minute_us, clicks, cost_micros FROM actual)
            SELECT count(*) FILTER (WHERE e.clicks IS DISTINCT FROM a.clicks OR e.cost_micros IS DISTINCT FROM a.cost_micros)
                       AS mismatched_keys,
                   count(a.clicks) AS rows, coalesce(sum(a.clicks), 0) AS clicks
            FROM expected e FULL OUTER JOIN actual a USING (advertiser_id, minute_us)""")
    return {**counts, "joined_clicks_version": through}


def refreshed_through(aggregates_path: str) -> tuple[int | None, int]:
    """The joined_clicks version the latest refresh of click_aggregates named (None: none among its
    last NOTE_SEARCH_COMMITS commits: a full refresh follows), and the table's latest version. A
    commit by another writer after it names nothing: the check then finds what that writer changed."""
    history = sorted(deltalake.DeltaTable(aggregates_path).history(NOTE_SEARCH_COMMITS), key=lambda c: -c["version"])
    notes = [c["userMetadata"] for c in history if (c.get("userMetadata") or "").startswith(VERSION_NOTE)]
    return (int(notes[0][len(VERSION_NOTE):]) if notes else None), history[0]["version"]


class ClicksJoinedTwice(Exception):
    """joined_clicks holds a click id twice in the versions a refresh would publish."""


def changed_aggregates(joined_path: str, after: int, through: int) -> pa.Table | None:
    """Per (advertiser_id, minute): the clicks and cost added to joined_clicks in versions
    (after, through], less those removed; None when the change feed cannot tell (its files vacuumed
    by table maintenance). Raises ClicksJoinedTwice when a click id inserted in them was already
    joined by `after`, or is inserted twice."""
    try:
        feed = deltalake.DeltaTable(joined_path).load_cdf(
            starting_version=after + 1, ending_version=through,
            columns=["click_id", "advertiser_id", "timestamp_us", "cost_micros", "_change_type"])
        rows = pa.RecordBatchReader.from_stream(feed).read_all()
        refuse_clicks_joined_twice(joined_path, after, rows)
    # A vacuumed file surfaces while the stream or version `after` is read: ArrowInvalid ("Object at
    # location ... not found") from the feed, a DuckDB error from its scan of `after`.
    except (deltalake.exceptions.DeltaError, pa.ArrowException, OSError, duckdb.Error):
        return None
    kinds = rows["_change_type"].cast(pa.string()).to_numpy(zero_copy_only=False)
    sign = np.select([kinds == kind for kind in SIGNS], list(SIGNS.values()), 0)
    times = rows["timestamp_us"].to_numpy()
    minutes = pa.array(np.floor_divide(times, MINUTE_US) * MINUTE_US, pa.timestamp("us", tz="UTC"))
    counted = pa.table({
        "advertiser_id": rows["advertiser_id"].cast(pa.string()), "minute": minutes,
        "clicks": pa.array(sign, pa.int64()), "cost_micros": pa.array(sign * rows["cost_micros"].to_numpy(), pa.int64()),
    })
    return _summed(counted)


def refuse_clicks_joined_twice(joined_path: str, after: int | None, rows: pa.Table | ds.Dataset) -> None:
    """The aggregates publish no click twice, whatever the checks have seen yet: the click ids of the
    change feed's inserted `rows` must be distinct and absent from joined_clicks at version `after`
    (None: `rows` is the whole table). Counted by DuckDB; raises ClicksJoinedTwice naming how many."""
    before = no_rows("joined_clicks") if after is None else delta_rows("joined_clicks", joined_path, after)
    with duckdb_over({"changes": rows, "joined": before}) as con:
        inserted = "(SELECT click_id FROM changes WHERE _change_type = 'insert')" if "_change_type" in rows.schema.names \
            else "(SELECT click_id FROM changes)"
        twice = one_row(con, f"""
            SELECT (SELECT count(*) - count(DISTINCT click_id) FROM {inserted}) AS repeated,
                   (SELECT count(*) FROM {inserted} i SEMI JOIN joined j USING (click_id)) AS again""")
    if twice["repeated"] or twice["again"]:
        raise ClicksJoinedTwice(
            f"joined_clicks holds {twice['repeated'] + twice['again']} click id(s) joined twice in versions after "
            f"{after}: click_aggregates not refreshed (joined_clicks_unique names them; recover_lost_clicks removes them)")


def _summed(rows: pa.Table) -> pa.Table:
    """Clicks and cost summed per key; keys left with no click dropped."""
    summed = rows.group_by(KEYS).aggregate([("clicks", "sum"), ("cost_micros", "sum")]).rename_columns(
        [*KEYS, "clicks", "cost_micros"])
    return summed.filter(pc.not_equal(summed["clicks"], 0))


def refresh_aggregates(spark: SparkSession, joined_path: str, aggregates_path: str, full: bool = False) -> dict:
    """Brings click_aggregates up to joined_clicks' latest version (see the module docstring). Under
    the table's lock: refreshes commit in snapshot order. Returns what it did."""
    ensure_table("click_aggregates", aggregates_path)
    with table_lock(aggregates_path):
        version, snapshot = latest_snapshot(spark, "joined_clicks", joined_path)
        since = None if full else refreshed_through(aggregates_path)[0]
        done = {"joined_clicks_version": version, "since_version": since}
        if since is not None and since >= version:
            return {**done, "refreshed": "none"}
        changes = None if since is None else changed_aggregates(joined_path, since, version)
        with commit_note(spark, f"{VERSION_NOTE}{version}"):
            if changes is None:
                refuse_clicks_joined_twice(joined_path, None, delta_rows("joined_clicks", joined_path, version))
                overwrite(aggregate_clicks(snapshot), "click_aggregates", aggregates_path)
                return {**done, "refreshed": "all"}
            if not changes.num_rows:
                # Versions without row changes (table maintenance): the aggregates still equal them.
                return {**done, "refreshed": "none"}
            _add(spark, changes, aggregates_path)
    return {**done, "refreshed": "changes"}


def _add(spark: SparkSession, changes: pa.Table, path: str) -> None:
    """The minutes the changes span rewritten, each key's clicks and cost with the changes added."""
    bounds = pc.min_max(changes["minute"])
    low, high = bounds["min"], bounds["max"]
    current = deltalake.DeltaTable(path).to_pyarrow_dataset().to_table(
        columns=[*KEYS, "clicks", "cost_micros"], filter=(ds.field("minute") >= low) & (ds.field("minute") <= high))
    current = current.cast(changes.schema)
    fresh = _summed(pa.concat_tables([current, changes]))
    schema = TABLE_SCHEMAS["click_aggregates"][0]
    rows = spark.createDataFrame(fresh, schema=schema)
    low_us, high_us = low.value, high.value
    overwrite_where(rows, "click_aggregates", path,
                    f"minute BETWEEN timestamp_micros({low_us}) AND timestamp_micros({high_us})")
