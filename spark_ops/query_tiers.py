"""The EventStore (Photon §3.4): finds the query of each click, in three tiers.

1. Memory tier: the recent query lines of the datacenter, held by the registry service
   (resources/event_store/memory_tier.py); past its byte budget, the older ones only located (file, offset,
   length), their lines read back from the logs by the asking task. A click run's executors ask it
   along with the registry lookup (spark_ops/registry_calls.py: lookup_clicks); almost every click
   of a live stream is answered there. A miss newer than its horizon, of a writer ingested past the
   query's time, is conclusive: the query was never ingested, and no other tier is read for it.
2. Durable tier: `query_logs`, an exact index of the valid query lines of the last
   `query_cache_retention_seconds` of event time (table maintenance evicts older ones): where each
   lies in the raw logs (file, offset, length), which are durable and never rewritten, so the lines
   are not copied. Searched only for the memory tier's inconclusive misses, and only around the
   times their query ids name; the lines found are read from the logs.
3. Logs tier: for what neither holds, `log_file_map` — a sparse index with an entry for the first
   query of every W seconds of event time and of every M bytes of each writer's log file — points
   into the raw query logs. A query id names its writer and timestamp (`<ip>:<pid>:<timestamp_us>`);
   the entry of that writer with the largest timestamp at or below the query's starts the range to
   read, and the writer's next entry in the same file ends it (a writer logs in timestamp order, so
   the query is inside if it was logged). The misses of a batch are resolved together: each file
   range is read once, by executors, whatever number of clicks need it.
A miss whose query is newer than everything ingested from its writer is not read for in any tier:
its query has not been ingested yet, and the click waits as a pending click (spark_ops/pending.py)
until the writer's progress passes it. Every tier answers with the query's line; the query events of
the clicks found are parsed from their lines once (spark_ops/parse.py: with_query_struct).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from spark_ops.meter import count_commit
from spark_ops.parse import LOOKUP_CHUNK_FIELDS, events, parse_chunks
from spark_ops.schemas import PARSED, arrow_schema
from spark_ops.tables import delta_path, sql_literal, table_lock

# `<server_ip>:<process_id>:<timestamp_us>`; an IPv6 address may itself contain colons.
EVENT_ID = r"^(.+):([^:]+):(\d+)$"
# The durable tier is searched this far around the event times the clicks' query ids name; a query
# whose own timestamp is further from its id's is found by the logs tier instead.
CACHE_SLACK_US = 300_000_000


def event_id_parts(column: str) -> list:
    """(server_ip, process_id, timestamp_us) of an event id column; nulls if it is not of that form."""
    return [
        F.nullif(F.regexp_extract(column, EVENT_ID, 1), F.lit("")).alias("server_ip"),
        F.nullif(F.regexp_extract(column, EVENT_ID, 2), F.lit("")).alias("process_id"),
        F.nullif(F.regexp_extract(column, EVENT_ID, 3), F.lit("")).cast("long").alias("query_ts"),
    ]


def writers_of(event_ids: pa.Array) -> pa.Array:
    """The writer (`<server_ip>:<process_id>`) of each event id, in Arrow; null if it is not of
    EVENT_ID's form (event_id_parts' server_ip and process_id, joined)."""
    pattern = r"^(?P<writer>.+:[^:]+):\d+$"
    return pc.struct_field(pc.extract_regex(event_ids, pattern), "writer")


def evict_from_cache(spark: SparkSession, path: str, dc: str, before_us: int) -> tuple[int, int | None]:
    """Removes a datacenter's queries older than `before_us` from the durable tier (table maintenance
    deletes their files later). Returns the rows removed and the oldest event time kept (None: none
    kept)."""
    ts = F.col("timestamp_us")
    in_dc = spark.read.format("delta").load(path).where(F.col("dc") == dc)
    scan = in_dc.agg(
        F.count_if(ts < before_us).alias("removed"), F.min(F.when(ts >= before_us, ts)).alias("oldest_kept")
    ).first()
    if scan["removed"]:
        with table_lock(path):
            spark.sql(f"DELETE FROM {delta_path(path)} WHERE dc = {sql_literal(dc)} AND timestamp_us < {int(before_us)}")
            count_commit("query_logs")
    return scan["removed"], scan["oldest_kept"]


@dataclass
class EventStoreStats:
    memory_hits: int = 0
    durable_hits: int = 0
    logs_hits: int = 0
    not_found: int = 0
    not_ingested_yet: int = 0  # of not_found: the query's writer was not ingested up to its time
    logs_ranges_read: int = 0
    logs_bytes_read: int = 0


@dataclass(frozen=True)
class DurableTiers:
    """A datacenter's durable tier (query_logs) and log file map, as of when they were read, and
    `durable_complete_from_us`: every query ingested from this event time on is in `durable`; read
    after the writers' progress and before the tables (QueryCache), it lets the logs tier skip such
    misses."""

    durable: DataFrame
    log_file_map: DataFrame
    durable_complete_from_us: int | None = None


class EventStore:
    def __init__(
        self,
        tiers: Callable[[], DurableTiers],
        query_dir: Path,
        map_every_seconds: float,
        map_every_bytes: int,
        max_line_bytes: int,
    ):
        """`tiers` reads this datacenter's durable tiers when a lookup first needs them (a live
        pass needs none: the memory tier answers it); `query_dir`: its raw query logs."""
        self._tiers = tiers
        self.query_dir = query_dir
        self.window_us = int(map_every_seconds * 1_000_000)
        # Entries are at most W seconds or about 2M bytes apart (the first query of each M-byte span
        # may sit near its end): a range past the writer's last entry reads at most this far.
        self.open_range_bytes = 2 * map_every_bytes + max_line_bytes
        self.max_line_bytes = max_line_bytes
        self.stats = EventStoreStats()
        self._held: list[DataFrame] = []

    @cached_property
    def tiers(self) -> DurableTiers:
        return self._tiers()

    def _keep(self, df: DataFrame) -> DataFrame:
        self._held.append(df.persist(StorageLevel.MEMORY_AND_DISK))
        return df

    def release(self) -> None:
        for df in self._held:
            df.unpersist()
        self._held.clear()

    def beyond_memory(self, misses: DataFrame) -> DataFrame:
        """The lines (click_id, query_timestamp_us, line) of the queries of `misses` (click_id, query_id: clicks whose
        query the memory tier lacks, inconclusively, and whose writer was ingested past it) found in
        the durable tier or the raw logs. Fills `stats`."""
        # The clicks' keys are broadcast and the durable tier streams past them: it is the big side.
        # A query id may repeat in the logs (duplicate lines): one match per click.
        located = self._keep(
            self._durable_around(misses).select("query_id", "file", "offset", "length")
            .join(F.broadcast(misses.select("click_id", "query_id")), "query_id")
            .dropDuplicates(["click_id"])
        )
        from_durable = self._keep(self._read_lines(
            located, located.select("file", F.col("offset").alias("start"),
                                    (F.col("offset") + F.col("length")).alias("end"), "query_id")))
        rest = self._keep(misses.join(from_durable.select("click_id"), "click_id", "left_anti"))
        self.stats.durable_hits = from_durable.count()
        if rest.isEmpty():
            return from_durable
        from_logs = self._logs_tier(rest)
        if from_logs is None:
            return from_durable
        from_logs = self._keep(from_logs)
        self.stats.logs_hits = from_logs.count()
        return from_durable.unionByName(from_logs)

    def _durable_around(self, clicks: DataFrame) -> DataFrame:
        """The durable tier's rows within CACHE_SLACK_US of the event times the clicks' query ids
        name (the parser admits only ids of the event id form): Delta skips the files of other
        times instead of the join reading the whole tier."""
        bounds = clicks.select(event_id_parts("query_id")[2]).agg(
            F.min("query_ts").alias("low"), F.max("query_ts").alias("high")
        ).first()
        if bounds["low"] is None:
            return self.tiers.durable
        return self.tiers.durable.where(
            F.col("timestamp_us").between(bounds["low"] - CACHE_SLACK_US, bounds["high"] + CACHE_SLACK_US)
        )

    def _range_bytes(self, ranges: DataFrame) -> tuple[int, int]:
        """(ranges, bytes) the logs tier reads: a range past a writer's last map entry ends at most
        at the end of its file. One row per range reaches the driver."""
        spans = ranges.select("file", "start", "end").collect()
        sizes = {f: (self.query_dir / f).stat().st_size for f in {r["file"] for r in spans}}
        return len(spans), sum(max(0, min(r["end"], sizes[r["file"]]) - r["start"]) for r in spans)

    def _worth_reading(self, wanted: DataFrame) -> DataFrame | None:
        """The misses worth reading raw logs for (None: not one): those the durable tier would not
        hold. Logged at or after `durable_complete_from_us`, the query would be in the durable tier,
        where the lookup searches within CACHE_SLACK_US of its id's time: it does not exist (a click
        of a lost or never logged query, ~1% of clicks). The logs tier reads around the id's time
        too, so it could not find it either, only spend a read (~200 KB of log per click in a 2M
        backlog)."""
        complete_from = self.tiers.durable_complete_from_us
        if complete_from is None:
            return wanted
        worth = wanted.where(F.col("query_ts") < complete_from + CACHE_SLACK_US)
        return None if worth.isEmpty() else worth

    def _logs_tier(self, misses: DataFrame) -> DataFrame | None:
        """The misses' query lines (click_id, query_timestamp_us, line) found in the raw logs; None if no miss is worth
        a read."""
        wanted = self._worth_reading(
            misses.select("click_id", "query_id", *event_id_parts("query_id")).where(F.col("query_ts").isNotNull())
        )
        if wanted is None:
            return None
        entries = self.tiers.log_file_map.select(
            "server_ip", "process_id", "file", "offset", F.col("timestamp_us").alias("entry_ts"),
            F.floor(F.col("timestamp_us") / self.window_us).alias("window"),
        )
        # The entry with the largest timestamp at or below the query's lies in the query's own
        # W-second window: that window's first query in the query's file has an entry.
        starts = (
            wanted.withColumn("window", F.floor(F.col("query_ts") / self.window_us))
            .join(entries, ["server_ip", "process_id", "window"])
            .where(F.col("entry_ts") <= F.col("query_ts"))
            .groupBy("click_id", "query_id")
            .agg(F.max_by(F.struct("file", "offset"), F.struct("entry_ts", "offset")).alias("start"))
            .select("click_id", "query_id", F.col("start.file").alias("file"), F.col("start.offset").alias("start"))
        )
        files = starts.select("file").distinct()
        following = (
            self.tiers.log_file_map.select("file", "offset").join(files, "file").distinct()
            .withColumn("next", F.lead("offset").over(Window.partitionBy("file").orderBy("offset")))
        )
        needed = self._keep(
            starts.join(following.withColumnRenamed("offset", "start"), ["file", "start"], "left")
            .withColumn("end", F.coalesce("next", F.col("start") + self.open_range_bytes))
            .drop("next")
        )
        self.stats.logs_ranges_read, self.stats.logs_bytes_read = self._range_bytes(
            needed.select("file", "start", "end").distinct())
        return self._read_lines(needed, needed.select("file", "start", "end", "query_id"))

    def _read_lines(self, clicks: DataFrame, spans: DataFrame) -> DataFrame:
        """(click_id, query_timestamp_us, line) of `clicks` (click_id, query_id) whose query line is in the raw logs at
        `spans` (file, start, end, query_id: where to look for each query). Each span is read once,
        for all the query ids looked up in it, and only lines that may hold one of them are parsed."""
        ranges = spans.groupBy("file", "start", "end").agg(F.collect_set("query_id").alias("wanted"))
        chunks = ranges.select(
            F.concat(F.lit(str(self.query_dir) + "/"), "file").alias("path"),
            "file",
            F.col("end").alias("range_end"),
            F.col("start").alias("chunk_start"),
            F.col("end").alias("chunk_end"),
            F.lit(True).alias("owns_first_line"),
            "wanted",
        ).repartition(int(clicks.sparkSession.conf.get("spark.sql.shuffle.partitions")))
        schema = PARSED["query"]
        lines = chunks.select(*LOOKUP_CHUNK_FIELDS.fieldNames()).mapInArrow(
            parse_chunks("query", self.max_line_bytes, arrow_schema(schema)), schema)
        # Lines that do not parse were quarantined when the query work unit ingested them.
        found = (events(lines).select("query_id", F.col("timestamp_us").alias("query_timestamp_us"), "line")
                 .dropDuplicates(["query_id"]))
        return clicks.select("click_id", "query_id").join(found, "query_id").dropDuplicates(["click_id"]).select(
            "click_id", "query_timestamp_us", "line")
