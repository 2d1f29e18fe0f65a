"""The EventStore (Photon §3.4): finds the query of each click, in two tiers.

1. Cache tier: `query_logs`, the parsed queries of the last `query_cache_retention_seconds` of
   event time (spark_ops/ingest.py evicts older ones).
2. Logs tier: for the cache's misses, `log_file_map` — a sparse index with an entry for the first
   query of every W seconds of event time and of every M bytes of each writer's log file — points
   into the raw query logs. A query id names its writer and timestamp (`<ip>:<pid>:<timestamp_us>`);
   the entry of that writer with the largest timestamp at or below the query's starts the range to
   read, and the writer's next entry in the same file ends it (a writer logs in timestamp order, so
   the query is inside if it was logged). The misses of a batch are resolved together: each file
   range is read once, by executors, whatever number of clicks need it. A miss whose query is newer
   than everything ingested from its writer is not read for: its query has not been ingested yet,
   and the click waits as a pending click (spark_ops/pending.py) until the writer's progress passes it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_ops.meter import count_commit
from spark_ops.parse import LOOKUP_CHUNK_FIELDS, events, parse_chunks
from spark_ops.schemas import PARSED, arrow_schema, literal_frame
from spark_ops.tables import delta_path, sql_literal, table_lock

# `<server_ip>:<process_id>:<timestamp_us>`; an IPv6 address may itself contain colons.
EVENT_ID = r"^(.+):([^:]+):(\d+)$"
INGESTED_SCHEMA = T.StructType(
    [T.StructField("server_ip", T.StringType()), T.StructField("process_id", T.StringType()),
     T.StructField("writer_ts", T.LongType())]
)
# The cache tier is searched this far around the event times the clicks' query ids name; a query
# whose own timestamp is further from its id's is found by the logs tier instead.
CACHE_SLACK_US = 300_000_000


def event_id_parts(column: str) -> list:
    """(server_ip, process_id, timestamp_us) of an event id column; nulls if it is not of that form."""
    return [
        F.nullif(F.regexp_extract(column, EVENT_ID, 1), F.lit("")).alias("server_ip"),
        F.nullif(F.regexp_extract(column, EVENT_ID, 2), F.lit("")).alias("process_id"),
        F.nullif(F.regexp_extract(column, EVENT_ID, 3), F.lit("")).cast("long").alias("query_ts"),
    ]


def query_struct(queries: DataFrame) -> DataFrame:
    return queries.select(
        "query_id", F.struct("query_id", "timestamp_us", "query_text", "ads", "extra").alias("query")
    )


def evict_from_cache(
    spark: SparkSession, path: str, dc: str, before_us: int, vacuum_retain_hours: float
) -> tuple[int, int | None]:
    """Removes a datacenter's queries older than `before_us` from the cache tier and deletes the data
    files no version younger than `vacuum_retain_hours` still needs (a click run may be reading an
    older snapshot). Returns the rows removed and the oldest event time kept (None: none kept)."""
    ts = F.col("timestamp_us")
    in_dc = spark.read.format("delta").load(path).where(F.col("dc") == dc)
    scan = in_dc.agg(
        F.count_if(ts < before_us).alias("removed"), F.min(F.when(ts >= before_us, ts)).alias("oldest_kept")
    ).first()
    if scan["removed"]:
        with table_lock(path):
            spark.sql(f"DELETE FROM {delta_path(path)} WHERE dc = {sql_literal(dc)} AND timestamp_us < {int(before_us)}")
            count_commit("query_logs")
            # Files an earlier eviction removed are deleted once they are old enough.
            spark.sql(f"VACUUM {delta_path(path)} RETAIN {float(vacuum_retain_hours)} HOURS")
    return scan["removed"], scan["oldest_kept"]


@dataclass
class EventStoreStats:
    cache_hits: int = 0
    logs_hits: int = 0
    not_found: int = 0
    not_ingested_yet: int = 0  # of not_found: the query's writer was not ingested up to its time
    logs_ranges_read: int = 0
    logs_bytes_read: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class EventStore:
    def __init__(
        self,
        cache: DataFrame,
        log_file_map: DataFrame,
        query_dir: Path,
        map_every_seconds: float,
        map_every_bytes: int,
        max_line_bytes: int,
        ingested_until: dict[str, int] | None = None,
        cache_complete_from_us: int | None = None,
    ):
        """`cache` and `log_file_map`: this datacenter's rows; `query_dir`: its raw query logs;
        `ingested_until`: per query writer (`server_ip:process_id`), the newest query time ingested,
        read before the tables (QueryProgress); None reads the logs for every miss;
        `cache_complete_from_us`: every ingested query from this event time on is in `cache`, read
        after the progress and before the tables (QueryCache): the logs tier skips such misses."""
        self.cache = cache
        self.ingested_until = ingested_until
        self.cache_complete_from_us = cache_complete_from_us
        self.log_file_map = log_file_map
        self.query_dir = query_dir
        self.window_us = int(map_every_seconds * 1_000_000)
        # Entries are at most W seconds or about 2M bytes apart (the first query of each M-byte span
        # may sit near its end): a range past the writer's last entry reads at most this far.
        self.open_range_bytes = 2 * map_every_bytes + max_line_bytes
        self.max_line_bytes = max_line_bytes
        self.stats = EventStoreStats()
        self._held: list[DataFrame] = []

    def _keep(self, df: DataFrame) -> DataFrame:
        self._held.append(df.persist(StorageLevel.MEMORY_AND_DISK))
        return df

    def release(self) -> None:
        for df in self._held:
            df.unpersist()
        self._held.clear()

    def lookup(self, clicks: DataFrame) -> tuple[DataFrame, DataFrame]:
        """Splits `clicks` (one row per `click_id`, with its `query_id`) into those whose query was
        found, with a `query` struct column, and those not found (without it). Fills `stats`."""
        # The clicks' keys are broadcast and the cache streams past them: the cache is the big
        # side, and a join that kept every click (a left outer join) would shuffle every cache row
        # of the window, full query included (7 s against 1.5 s for 400 clicks in a live run).
        # A query id may repeat in the logs (duplicate lines): one match per click.
        matches = self._keep(
            query_struct(self._cache_around(clicks))
            .join(F.broadcast(clicks.select("click_id", "query_id")), "query_id")
            .dropDuplicates(["click_id"])
            .select("click_id", "query")
        )
        cached = clicks.join(matches, "click_id")
        misses = self._keep(clicks.join(matches.select("click_id"), "click_id", "left_anti"))
        self.stats.cache_hits = matches.count()
        n_misses = misses.count()
        if n_misses == 0:
            return cached, misses
        from_logs = self._logs_tier(misses)
        if from_logs is None:
            self.stats.not_found = n_misses
            return cached, misses
        from_logs = self._keep(from_logs)
        self.stats.logs_hits = from_logs.count()
        self.stats.not_found = n_misses - self.stats.logs_hits
        not_found = misses.join(from_logs.select("click_id"), "click_id", "left_anti")
        return cached.unionByName(from_logs), not_found

    def _cache_around(self, clicks: DataFrame) -> DataFrame:
        """The cache rows within CACHE_SLACK_US of the event times the clicks' query ids name (the
        parser admits only ids of the event id form): Delta skips the files of other times instead
        of the join reading the whole cache."""
        bounds = clicks.select(event_id_parts("query_id")[2]).agg(
            F.min("query_ts").alias("low"), F.max("query_ts").alias("high")
        ).first()
        if bounds["low"] is None:
            return self.cache
        return self.cache.where(
            F.col("timestamp_us").between(bounds["low"] - CACHE_SLACK_US, bounds["high"] + CACHE_SLACK_US)
        )

    def _range_bytes(self, ranges: DataFrame) -> tuple[int, int]:
        """(ranges, bytes) the logs tier reads: a range past a writer's last map entry ends at most
        at the end of its file. One row per range reaches the driver."""
        spans = ranges.select("file", "start", "end").collect()
        sizes = {f: (self.query_dir / f).stat().st_size for f in {r["file"] for r in spans}}
        return len(spans), sum(max(0, min(r["end"], sizes[r["file"]]) - r["start"]) for r in spans)

    def _worth_reading(self, wanted: DataFrame) -> DataFrame | None:
        """The misses worth reading raw logs for (None: not one): those whose query time its
        writer's ingested progress has reached, and that the cache tier would not hold. The others'
        queries are not in any table yet (a writer logs in timestamp order), and the raw logs past
        the progress have no map entry to find them by; or they do not exist. Reading for them would
        be wasted."""
        if self.ingested_until is None:
            return wanted
        rows = [(*writer.rpartition(":")[::2], ts) for writer, ts in self.ingested_until.items()]
        progress = literal_frame(wanted.sparkSession, rows, INGESTED_SCHEMA)
        # A writer not ingested at all has no progress row: none of its queries is ingested.
        ingested = F.coalesce(F.col("query_ts") <= F.col("writer_ts"), F.lit(False))
        # Logged at or after this time, the query would be in the cache tier, where the cache join
        # looks within CACHE_SLACK_US of its id's time: it does not exist (a click of a lost or never
        # logged query, ~1% of clicks). The logs tier reads around the id's time too, so it could
        # not find it either, only spend a read (~200 KB of log per click in a 2M backlog).
        uncached = (
            F.lit(True) if self.cache_complete_from_us is None
            else F.col("query_ts") < self.cache_complete_from_us + CACHE_SLACK_US
        )
        flagged = self._keep(
            wanted.join(F.broadcast(progress), ["server_ip", "process_id"], "left")
            .withColumn("ingested", ingested)
            .withColumn("worth_reading", F.col("ingested") & uncached)
            .drop("writer_ts")
        )
        # Both counts from one job; a batch with no miss to read for skips the logs tier's jobs.
        counts = flagged.agg(F.count_if(~F.col("ingested")), F.count_if(F.col("worth_reading"))).first()
        self.stats.not_ingested_yet = counts[0]
        if counts[1] == 0:
            return None
        return flagged.where("worth_reading").drop("ingested", "worth_reading")

    def _logs_tier(self, misses: DataFrame) -> DataFrame | None:
        """The misses' queries found in the raw logs; None if no miss is worth a read."""
        spark = misses.sparkSession
        wanted = self._worth_reading(
            misses.select("click_id", "query_id", *event_id_parts("query_id")).where(F.col("query_ts").isNotNull())
        )
        if wanted is None:
            return None
        entries = self.log_file_map.select(
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
            self.log_file_map.select("file", "offset").join(files, "file").distinct()
            .withColumn("next", F.lead("offset").over(Window.partitionBy("file").orderBy("offset")))
        )
        needed = self._keep(
            starts.join(following.withColumnRenamed("offset", "start"), ["file", "start"], "left")
            .withColumn("end", F.coalesce("next", F.col("start") + self.open_range_bytes))
            .drop("next")
        )
        # Each range is read once, for all the query ids looked up in it; only lines that may hold
        # one of them are parsed.
        ranges = self._keep(
            needed.groupBy("file", "start", "end").agg(F.collect_set("query_id").alias("wanted"))
        )
        prefix = str(self.query_dir) + "/"
        chunks = ranges.select(
            F.concat(F.lit(prefix), "file").alias("path"),
            "file",
            F.col("end").alias("range_end"),
            F.col("start").alias("chunk_start"),
            F.col("end").alias("chunk_end"),
            F.lit(True).alias("owns_first_line"),
            "wanted",
        ).repartition(int(spark.conf.get("spark.sql.shuffle.partitions")))
        schema = PARSED["query"]
        lines = self._keep(
            chunks.select(*LOOKUP_CHUNK_FIELDS.fieldNames()).mapInArrow(
                parse_chunks("query", self.max_line_bytes, arrow_schema(schema)), schema
            )
        )
        self.stats.logs_ranges_read, self.stats.logs_bytes_read = self._range_bytes(ranges)
        # Lines that do not parse were quarantined when the query work unit ingested them.
        found = query_struct(events(lines)).dropDuplicates(["query_id"])
        return (
            misses.join(needed.select("click_id"), "click_id", "left_semi")
            .join(found, "query_id")
            .dropDuplicates(["click_id"])
        )
