"""Peer systems for the benchmark: what a data engineer would run instead of Photon.

Each joins the click log with the query log of one datacenter replica (docs/CONTRACTS.md: input logs) and
compare the joined click ids with the generator's ground truth (`gen_summary.json`).

1. ``duckdb``: the single-node floor. One batch: ``read_json`` of every click and query file,
   valid clicks deduplicated by ``click_id``, inner join on ``query_id``, ``COPY`` to Parquet.
   It sees all the data at once, so it joins late queries too; it is the lower bound on time for
   a join that needs no state, no exactly-once bookkeeping and no incremental progress.
2. ``streaming``: Spark Structured Streaming, the stream-stream inner join of the Spark guide:
   JSON file sources with an explicit schema, event-time watermarks on both sides, a join on
   ``query_id`` with an event-time range condition, clicks deduplicated within the watermark, a
   Delta sink with a checkpoint, ``Trigger.AvailableNow`` to process the backlog and stop. It is
   then run a second time over the same logs with a fresh checkpoint into the same table (what a
   second datacenter's pipeline, or a restart from a lost checkpoint, does) to count the click
   ids that end up twice in the output.
3. ``spark-batch``: DuckDB's one batch done by Spark (explicit schemas, one Parquet write): the
   floor of a join on Photon's own engine on this machine.
4. ``streaming-live``: the same stream-stream join left running while ``photon gen --follow``
   writes the logs, for the live latency. Its file source is fed each log file once the file is
   complete (hard links into the watched directory, as a log shipper would), because it reads a
   file once.
5. ``flink``: Apache Flink's interval join in Flink SQL (benchmarks/flink_join.py, run in Flink's
   own virtual environment ``.venv-flink``): JSON file sources skipping bad lines, watermarks,
   clicks deduplicated by ``click_id``, exactly-once checkpoints, a Parquet sink committed on
   checkpoint; the backlog read by bounded sources in streaming mode.
6. ``flink-live``: the same job with sources that list the shipped directories every second,
   fed like ``streaming-live``, for the live latency (a click is visible when its part file is
   committed).

Structured Streaming starts a session of its own (``streaming_session``: 8 GiB driver, 2 shuffle
partitions, RocksDB state store), not Photon's; its watermark and join window default to the
workload's real bound, the generator's 300 s cap on the click delay. Each streaming peer's result
records its ``settings``.

How bad input behaves (measured on generated logs, DuckDB 2.0, Spark 4.0):

* DuckDB ``ignore_errors`` does not skip a bad line: a line that is not JSON, not an object, or
  the torn last line becomes a row of NULLs, and a mistyped field becomes NULL; the ``NOT NULL``
  filter on the required fields removes them. DuckDB casts leniently: ``1.5`` for a BIGINT is
  rounded to 2 and a number for a VARCHAR becomes a string, and ``maximum_object_size`` does not
  bound a newline-delimited line, so the over-long line is read as a valid event.
* Spark's JSON reader in DROPMALFORMED mode drops lines it cannot parse or convert to the schema
  (not JSON, not an object, the torn last line, ``"abc"`` or ``1.5`` for a long); a missing field
  is NULL and is filtered; a number for a string becomes a string, as in DuckDB. It has no line
  length limit either. The streaming file source reads a file once: the torn line is dropped as
  malformed, and neither the click it becomes once its writer completes the line nor any line
  appended later is ever read, even by a later run on the same checkpoint (the source expects
  files to be placed atomically; append-only growing logs are not its model).

Measurement notes: counting the output and collecting its click ids to the driver for the
comparison with the ground truth is done after the timed part, and is fine at benchmark scale
(20k-200k clicks). Peak memory of DuckDB is the peak RSS of this process (run each peer in its own
process, as the command line does, for a clean number); the JVM's is its peak RSS since it started.
The streaming ``wall_seconds`` is the first run, from start to the end of availableNow, without the
session's start (``session_start_seconds``, when this module starts it) but with the warm-up of the
JVM's first streaming query; ``replay.wall_seconds`` is the same work again in a warm JVM.

    python benchmarks/peers.py duckdb --data-dir DIR [--out-dir DIR] [--datacenter dc1]
    python benchmarks/peers.py streaming --data-dir DIR [--out-dir DIR] [--watermark "300 seconds"]
        [--join-window "300 seconds"] [--max-files-per-trigger N] [--driver-memory 8g] [--shuffle-partitions 2]
    python benchmarks/peers.py spark-batch --data-dir DIR [--out-dir DIR]
    python benchmarks/peers.py streaming-live --data-dir DIR --out-dir DIR [--watermark "300 seconds"]
        [--trigger-seconds 0]
    python benchmarks/peers.py flink|flink-live --data-dir DIR [--out-dir DIR] [--watermark-seconds S]
        [--join-window-seconds 300] [--checkpoint-seconds S] [--parallelism 1] [--state-backend B]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from photon.gen import SUMMARY_FILE, GenConfig

REPO = Path(__file__).resolve().parent.parent

MB = 1_000_000

# DuckDB and Spark are imported where they are used, so that the DuckDB peer's peak RSS does not
# include pyspark's (and Dagster's, through resources.spark) modules.


# -- shared ------------------------------------------------------------------

def stream_dir(data_dir: Path, datacenter: str, stream: str) -> Path:
    return data_dir / "logs" / datacenter / stream


def input_bytes(data_dir: Path, datacenter: str) -> int:
    streams = ("query", "click")
    return sum(p.stat().st_size for s in streams for p in stream_dir(data_dir, datacenter, s).rglob("*.jsonl"))


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def ground_truth(data_dir: Path) -> dict:
    return json.loads((data_dir / SUMMARY_FILE).read_text(encoding="utf-8"))


def compare_with_truth(joined_ids: set[str], truth: dict) -> dict:
    """Joined click ids against the clicks whose query is on disk: equal, missing, extra, and how
    many of the missing ones belong to a late query (a delayed log shipment)."""
    expected = set(truth["joinable_click_ids"])
    missing = expected - joined_ids
    return {
        "expected_clicks": len(expected),
        "joined_equals_truth": joined_ids == expected,
        "missing_clicks": len(missing),
        "missing_late_clicks": len(missing & set(truth["late_click_ids"])),
        "extra_clicks": len(joined_ids - expected),
    }


def process_peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


# -- DuckDB: single-node batch floor ------------------------------------------

CLICK_COLUMNS = {"click_id": "VARCHAR", "query_id": "VARCHAR", "timestamp_us": "BIGINT", "ad_id": "VARCHAR",
                 "advertiser_id": "VARCHAR", "cost_micros": "BIGINT"}
QUERY_COLUMNS = {"query_id": "VARCHAR", "timestamp_us": "BIGINT", "query_text": "VARCHAR",
                 "ads": "STRUCT(ad_id VARCHAR, advertiser_id VARCHAR, position BIGINT, bid_micros BIGINT)[]"}


def read_json_sql(files_glob: str, columns: dict[str, str]) -> str:
    """A read_json of the required fields that keeps only rows with all of them: with
    ignore_errors a bad line is a row of NULLs, not a skipped line."""
    spec = ", ".join(f"{name}: '{kind}'" for name, kind in columns.items())
    valid = " AND ".join(f"{name} IS NOT NULL" for name in columns)
    return (f"SELECT * FROM read_json('{files_glob}', format = 'newline_delimited', columns = {{{spec}}}, "
            f"ignore_errors = true) WHERE {valid}")


def run_duckdb(data_dir: Path, out_dir: Path, datacenter: str = "dc1") -> dict:
    """The join as one DuckDB batch, written to out_dir/duckdb/joined_clicks.parquet."""
    import duckdb

    data_dir, out = Path(data_dir), Path(out_dir) / "duckdb"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    target = out / "joined_clicks.parquet"
    clicks = read_json_sql(f"{stream_dir(data_dir, datacenter, 'click')}/**/*.jsonl", CLICK_COLUMNS)
    queries = read_json_sql(f"{stream_dir(data_dir, datacenter, 'query')}/**/*.jsonl", QUERY_COLUMNS)

    started = time.monotonic()
    con = duckdb.connect()
    # A duplicate line repeats its click verbatim: any line of a click_id will do.
    con.execute(f"CREATE TEMP TABLE clicks AS {clicks} QUALIFY row_number() OVER (PARTITION BY click_id) = 1")
    con.execute(f"CREATE TEMP TABLE queries AS {queries}")
    joined = con.execute(f"""
        COPY (
            SELECT c.*, struct_pack(query_id := q.query_id, timestamp_us := q.timestamp_us,
                                    query_text := q.query_text, ads := q.ads) AS query
            FROM clicks c JOIN queries q ON c.query_id = q.query_id
        ) TO '{target}' (FORMAT parquet)""").fetchone()[0]
    wall = time.monotonic() - started

    distinct_clicks = con.execute("SELECT count(*) FROM clicks").fetchone()[0]
    valid_queries = con.execute("SELECT count(*) FROM queries").fetchone()[0]
    joined_ids = {row[0] for row in con.execute(f"SELECT click_id FROM '{target}'").fetchall()}
    con.close()
    size = input_bytes(data_dir, datacenter)
    return {
        "peer": "duckdb",
        "duckdb_version": duckdb.__version__,
        "wall_seconds": round(wall, 3),
        "joined_rows": joined,
        "joined_distinct_clicks": len(joined_ids),
        "distinct_clicks": distinct_clicks,
        "valid_queries": valid_queries,
        "input_bytes": size,
        "input_mb_per_second": round(size / MB / wall, 2),
        "joined_clicks_per_second": round(joined / wall, 1),
        "output_bytes": target.stat().st_size,
        "peak_rss_bytes": process_peak_rss_bytes(),
        "correctness": compare_with_truth(joined_ids, ground_truth(data_dir)),
    }


# -- Spark Structured Streaming: stream-stream join ---------------------------

# The workload's real bound on the query-to-click delay (the generator's cap, `photon gen
# --click-delay-max-s`): the default join window and watermark of both streaming peers.
CLICK_DELAY_MAX_SECONDS = GenConfig.click_delay_max_s
DEFAULT_BOUND = f"{CLICK_DELAY_MAX_SECONDS:g} seconds"

# Structured Streaming's own session, as a user of this 2-core, 24 GiB machine would start it for
# this one query (issue 45). Nothing is taken from Photon's settings (resources/settings.py, or
# resources/spark/session.py's driver memory, sized for Photon's 4 GiB budget): only Delta's jars are the
# project's, fetched by scripts/setup.sh into .cache/jars.
STREAMING_DRIVER_MEMORY = "8g"
# One state store instance per shuffle partition and stateful operator: 2 for 2 cores in a backlog;
# live, 1 had the best p90 of the tuning sweep (benchmarks/results/2026-11-26-peer-tuning.json: 31.8 s,
# against 40.2 s with 2 and 35.9 s with 4).
STREAMING_SHUFFLE_PARTITIONS = 2
STREAMING_LIVE_SHUFFLE_PARTITIONS = 1
DELTA_JARS_DIR = REPO / ".cache" / "jars"


STATE_STORES = {
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    # Spark's default: the state in the JVM heap, a versioned map written out whole per batch.
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
}


def streaming_conf(shuffle_partitions: int = STREAMING_SHUFFLE_PARTITIONS, state_store: str = "rocksdb") -> dict[str, str]:
    """The runtime SQL settings of the streaming query (set for its block on a shared session)."""
    conf = {
        # RocksDB keeps join and dedup state off the JVM heap; changelog checkpointing uploads only
        # the changes of a batch (both recommended by the Spark and Databricks guides).
        "spark.sql.streaming.stateStore.providerClass": STATE_STORES[state_store],
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
    }
    if state_store == "rocksdb":
        conf["spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"] = "true"
    return conf


def photon_jvm_options() -> str:
    """The JVM options Photon's own JVMs get by default (resources/spark/session.py): the serial
    collector and the JIT thresholds; offered to the peers (`--jvm-options`) to take the JVM's part out
    of a comparison. Photon's class archive is not: it is made for Photon's class path, and this Java
    (17) cannot make one for another at run time (-XX:+AutoCreateSharedArchive came in 19)."""
    from resources.spark.session import COLLECTOR, JIT_OPTIONS

    return " ".join([COLLECTOR, *JIT_OPTIONS])


STATE_STORE_CONF = streaming_conf()


def peer_local_conf(app_name: str, driver_memory: str, parallelism: int) -> dict[str, str]:
    """What every Spark peer's own local session sets: 2 cores, its memory, quiet, UTC."""
    return {
        "spark.master": "local[2]",
        "spark.app.name": app_name,
        "spark.driver.memory": driver_memory,
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.log.level": "ERROR",
        "spark.sql.session.timeZone": "UTC",
        "spark.default.parallelism": str(parallelism),
    }


def local_session(conf: dict[str, str]):
    """This process's first local session, with `conf`."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def streaming_session_conf(driver_memory: str = STREAMING_DRIVER_MEMORY,
                           shuffle_partitions: int = STREAMING_SHUFFLE_PARTITIONS, state_store: str = "rocksdb",
                           jvm_options: str = "") -> dict[str, str]:
    """The static settings of the peer's own local session; `jvm_options` for its JVM (none by
    default: Java's own collector and JIT, as a Spark user runs them)."""
    jars = sorted(DELTA_JARS_DIR.glob("delta-spark_2.13-*.jar")) + sorted(DELTA_JARS_DIR.glob("delta-storage-*.jar"))
    if len(jars) < 2:
        raise SystemExit(f"Delta jars missing in {DELTA_JARS_DIR}: run scripts/setup.sh first")
    conf = {
        **peer_local_conf("peer-structured-streaming", driver_memory, shuffle_partitions),
        "spark.jars": ",".join(str(j) for j in jars),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        **streaming_conf(shuffle_partitions, state_store),
    }
    if jvm_options:
        conf["spark.driver.extraJavaOptions"] = jvm_options
    return conf


def streaming_session(driver_memory: str = STREAMING_DRIVER_MEMORY,
                      shuffle_partitions: int = STREAMING_SHUFFLE_PARTITIONS, state_store: str = "rocksdb",
                      jvm_options: str = ""):
    """The peer's own local session (the first one of this process)."""
    return local_session(streaming_session_conf(driver_memory, shuffle_partitions, state_store, jvm_options))


# The Spark batch join's own session, as its user would start it on this machine for one join of
# a few hundred MB: the memory the machine can give, and shuffle partitions for 2 cores (Spark's
# default, 200, is for clusters; adaptive execution is on either way). Not Photon's settings.
BATCH_DRIVER_MEMORY = "8g"
BATCH_SHUFFLE_PARTITIONS = 4


def batch_session_conf() -> dict[str, str]:
    return {**peer_local_conf("peer-spark-batch", BATCH_DRIVER_MEMORY, BATCH_SHUFFLE_PARTITIONS),
            "spark.sql.shuffle.partitions": str(BATCH_SHUFFLE_PARTITIONS)}


def batch_session():
    """The Spark batch peer's own local session (the first one of this process)."""
    return local_session(batch_session_conf())


def timed_session(spark=None, factory=None):
    """The given session, or this process's own, started now by factory (default: the Spark batch
    peer's): (session, seconds its start took, None for a given one)."""
    if spark is not None:
        return spark, None
    factory = factory or batch_session
    started = time.monotonic()
    spark = factory()
    return spark, round(time.monotonic() - started, 3)


def streaming_settings(spark, conf: dict[str, str], **options) -> dict:
    """What the Structured Streaming peer ran with: its session's memory and its query's settings."""
    return {
        "spark.driver.memory": spark.conf.get("spark.driver.memory", None),
        "spark.master": spark.conf.get("spark.master", None),
        **conf,
        **options,
    }


def json_source(reader, schema: str):
    """A batch or streaming reader of every .jsonl under a path (files are nested by writer) with
    an explicit schema: lines it cannot parse or convert are dropped."""
    return (reader.format("json").schema(schema).option("mode", "DROPMALFORMED")
            .option("recursiveFileLookup", "true").option("pathGlobFilter", "*.jsonl"))


@contextmanager
def session_conf(spark, settings: dict[str, str]):
    """Set runtime SQL settings for a block and restore them after: the session may be shared."""
    previous = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


# The required fields as Spark DDL: with an explicit schema the reader infers nothing, and other
# fields are not read.
CLICK_SCHEMA = ("click_id STRING, query_id STRING, timestamp_us BIGINT, ad_id STRING, advertiser_id STRING, "
                "cost_micros BIGINT")
QUERY_SCHEMA = ("query_id STRING, timestamp_us BIGINT, query_text STRING, "
                "ads ARRAY<STRUCT<ad_id: STRING, advertiser_id: STRING, position: BIGINT, bid_micros: BIGINT>>")


def json_stream(spark, path: Path, schema: str, max_files_per_trigger: int | None):
    """A file source over every .jsonl under path (files are nested by writer), bad lines dropped
    by the parser and rows missing a required field (the schema holds only those) filtered."""
    reader = json_source(spark.readStream, schema)
    if max_files_per_trigger is not None:
        reader = reader.option("maxFilesPerTrigger", str(max_files_per_trigger))
    return reader.load(str(path)).dropna(how="any")


def joined_click_stream(spark, data_dir: Path, datacenter: str, watermark: str, join_window: str,
                        max_files_per_trigger: int | None):
    """Clicks with their query: watermarks on both event times, clicks deduplicated within the
    watermark, inner join on query_id with click time in [query time, query time + join_window]."""
    from pyspark.sql import functions as F

    clicks = (json_stream(spark, stream_dir(data_dir, datacenter, "click"), CLICK_SCHEMA, max_files_per_trigger)
              .withColumn("click_time", F.timestamp_micros("timestamp_us"))
              .withWatermark("click_time", watermark)
              .dropDuplicatesWithinWatermark(["click_id"]))
    queries = (json_stream(spark, stream_dir(data_dir, datacenter, "query"), QUERY_SCHEMA, max_files_per_trigger)
               .select(F.col("query_id").alias("q_query_id"),
                       F.timestamp_micros("timestamp_us").alias("query_time"),
                       F.struct("query_id", "timestamp_us", "query_text", "ads").alias("query"))
               .withWatermark("query_time", watermark))
    condition = F.expr(f"query_id = q_query_id AND click_time >= query_time "
                       f"AND click_time <= query_time + interval {join_window}")
    return (clicks.join(queries, condition, "inner")
            .select("click_id", "query_id", "timestamp_us", "ad_id", "advertiser_id", "cost_micros", "query"))


def run_stream_once(spark, data_dir: Path, datacenter: str, table: Path, checkpoint: Path, watermark: str,
                    join_window: str, max_files_per_trigger: int | None) -> dict:
    """One availableNow run of the join into the Delta table; its wall time and progress."""
    frame = joined_click_stream(spark, data_dir, datacenter, watermark, join_window, max_files_per_trigger)
    started = time.monotonic()
    query = (frame.writeStream.format("delta").outputMode("append")
             .option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start(str(table)))
    query.awaitTermination()
    wall = time.monotonic() - started
    progress = query.recentProgress
    return {
        "wall_seconds": round(wall, 3),
        "micro_batches": len(progress),
        "input_rows": sum(batch["numInputRows"] for batch in progress),
        "rows_dropped_by_watermark": rows_dropped_by_watermark(progress),
    }


def rows_dropped_by_watermark(progress: list) -> dict[str, int]:
    """Rows each stateful operator dropped as behind its watermark, over a query's micro-batches."""
    dropped: dict[str, int] = {}
    for batch in progress:
        for operator in batch["stateOperators"]:
            name = operator["operatorName"]
            dropped[name] = dropped.get(name, 0) + operator.get("numRowsDroppedByWatermark", 0)
    return dropped


def jvm_peak_rss_bytes(spark) -> int | None:
    """VmHWM of the JVM behind this session (the py4j gateway process), None if not readable."""
    proc = getattr(spark.sparkContext._gateway, "proc", None)
    if proc is None:
        return None
    try:
        status = Path(f"/proc/{proc.pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    return int(match[1]) * 1024 if match else None


def torn_line_behaviour(spark, data_dir: Path, datacenter: str, truth: dict) -> dict | None:
    """Whether Spark's JSON reader takes the torn last line of the generator's torn file for a
    malformed record (which DROPMALFORMED drops) rather than for a row."""
    if not truth.get("torn_file"):
        return None
    path = data_dir / "logs" / datacenter / truth["torn_file"]
    partial = path.read_bytes().rsplit(b"\n", 1)[-1].decode("utf-8", errors="replace")
    rows = spark.read.schema(f"{CLICK_SCHEMA}, _corrupt_record STRING").option("mode", "PERMISSIVE").json(str(path))
    # Spark refuses a query of raw JSON that references only the corrupt record column, unless cached.
    rows = rows.cache()
    malformed = rows.where(rows["_corrupt_record"] == partial).count()
    rows.unpersist()
    return {"file": truth["torn_file"], "partial_line_bytes": len(partial.encode()),
            "read_as_malformed_record": malformed == 1}


def run_streaming(data_dir: Path, out_dir: Path, datacenter: str = "dc1", watermark: str = DEFAULT_BOUND,
                  join_window: str = DEFAULT_BOUND, max_files_per_trigger: int | None = 4, spark=None,
                  replay: bool = True, driver_memory: str = STREAMING_DRIVER_MEMORY,
                  shuffle_partitions: int = STREAMING_SHUFFLE_PARTITIONS) -> dict:
    """The stream-stream join over the backlog, then a replay with a fresh checkpoint.

    Default watermark and join window: the workload's real bound, the generator's cap on the
    query-to-click delay (300 s; the mean is 20 s), well above the 30 s within which a duplicate
    click line reappears and above the skew between the regular query writers' files read in one
    trigger. It is not meant to cover the late queries: a delayed log shipment arrives after the
    other queries have moved the watermark past it, and its queries are dropped as late (Spark
    judges a row against the watermark of the previous micro-batch), and with them their clicks.
    Covering the longest shipment delay (here `--watermark "1 hour"`, the whole span) joins them,
    at the price of keeping that much state. (Before issue 45 both were 10 minutes.)

    Default files per trigger, 4 (for each source): one file of each regular query writer per
    micro-batch, so the backlog is replayed in the order in which its files were completed
    (the file source goes by modification time), a few minutes of event time at a time. With no
    limit, availableNow reads the whole backlog in one micro-batch and the watermark drops nothing.

    Without a given session, the peer starts its own (`streaming_session`: 8 GiB driver, 2 shuffle
    partitions); a given one (the test suite's) keeps its static settings.
    """
    spark, session_start_seconds = timed_session(
        spark, lambda: streaming_session(driver_memory, shuffle_partitions))
    data_dir, out = Path(data_dir), Path(out_dir) / "streaming"
    shutil.rmtree(out, ignore_errors=True)
    table = out / "joined_clicks"
    truth = ground_truth(data_dir)
    options = dict(watermark=watermark, join_window=join_window, max_files_per_trigger=max_files_per_trigger)
    conf = streaming_conf(shuffle_partitions)
    with session_conf(spark, conf):
        first = run_stream_once(spark, data_dir, datacenter, table, out / "checkpoint-1", **options)
        output_bytes = tree_bytes(table)
        result = spark.read.format("delta").load(str(table))
        joined_rows = result.count()
        joined_ids = {row.click_id for row in result.select("click_id").distinct().collect()}
        replayed_run, duplicates, rows_after_replay = None, None, None
        if replay:
            replayed_run = run_stream_once(spark, data_dir, datacenter, table, out / "checkpoint-2", **options)
            replayed = spark.read.format("delta").load(str(table))
            duplicates = replayed.groupBy("click_id").count().where("count > 1").count()
            rows_after_replay = replayed.count()
    size = input_bytes(data_dir, datacenter)
    wall = first["wall_seconds"]
    return {
        "peer": "spark_structured_streaming",
        "spark_version": spark.version,
        "settings": streaming_settings(spark, conf, trigger="availableNow", **options),
        "watermark": watermark,
        "join_window": join_window,
        "max_files_per_trigger": max_files_per_trigger,
        "state_store": conf["spark.sql.streaming.stateStore.providerClass"].rsplit(".", 1)[1],
        "session_start_seconds": session_start_seconds,
        "wall_seconds": wall,
        "micro_batches": first["micro_batches"],
        "input_rows": first["input_rows"],
        "rows_dropped_by_watermark": first["rows_dropped_by_watermark"],
        "joined_rows": joined_rows,
        "joined_distinct_clicks": len(joined_ids),
        "duplicates_in_one_run": joined_rows - len(joined_ids),
        "input_bytes": size,
        "input_mb_per_second": round(size / MB / wall, 2),
        "joined_clicks_per_second": round(joined_rows / wall, 1),
        "output_bytes": output_bytes,
        "jvm_peak_rss_bytes": jvm_peak_rss_bytes(spark),
        "correctness": compare_with_truth(joined_ids, truth),
        "replay": replayed_run and {"wall_seconds": replayed_run["wall_seconds"], "rows_after_replay": rows_after_replay},
        "duplicates_on_replay": duplicates,
        "torn_line": torn_line_behaviour(spark, data_dir, datacenter, truth),
    }


# -- Spark batch: the same one-shot join on Photon's engine --------------------

def run_spark_batch(data_dir: Path, out_dir: Path, datacenter: str = "dc1", spark=None) -> dict:
    """DuckDB's batch done by Spark in a session of its own (batch_session): every click and query file read once
    with an explicit schema, clicks deduplicated by click_id, inner join on query_id, one Parquet
    write. Spark's floor for this join on this machine: no state, no exactly-once bookkeeping, no
    incremental progress, the JVM already started (`session_start_seconds` apart)."""
    from pyspark.sql import functions as F

    spark, session_start_seconds = timed_session(spark)
    data_dir, out = Path(data_dir), Path(out_dir) / "spark-batch"
    shutil.rmtree(out, ignore_errors=True)
    target = out / "joined_clicks"

    def read(stream: str, schema: str):
        return json_source(spark.read, schema).load(str(stream_dir(data_dir, datacenter, stream))).dropna(how="any")

    started = time.monotonic()
    clicks = read("click", CLICK_SCHEMA).dropDuplicates(["click_id"])
    queries = read("query", QUERY_SCHEMA).select(
        F.col("query_id").alias("q_query_id"), F.struct("query_id", "timestamp_us", "query_text", "ads").alias("query"))
    (clicks.join(queries, clicks["query_id"] == queries["q_query_id"], "inner").drop("q_query_id")
     .write.parquet(str(target)))
    wall = time.monotonic() - started

    ids = [row.click_id for row in spark.read.parquet(str(target)).select("click_id").collect()]
    joined, joined_ids = len(ids), set(ids)
    size = input_bytes(data_dir, datacenter)
    return {
        "peer": "spark_batch",
        "spark_version": spark.version,
        "settings": {key: spark.conf.get(key, None) for key in
                     ("spark.master", "spark.driver.memory", "spark.sql.shuffle.partitions")},
        "session_start_seconds": session_start_seconds,
        "wall_seconds": round(wall, 3),
        "joined_rows": joined,
        "joined_distinct_clicks": len(joined_ids),
        "input_bytes": size,
        "input_mb_per_second": round(size / MB / wall, 2),
        "joined_clicks_per_second": round(joined / wall, 1),
        "output_bytes": tree_bytes(target),
        "jvm_peak_rss_bytes": jvm_peak_rss_bytes(spark),
        "correctness": compare_with_truth(joined_ids, ground_truth(data_dir)),
    }


# -- Spark Structured Streaming, live: the same join tailing logs being written ----

def complete_files(source: Path, all_complete: bool) -> list[Path]:
    """The log files under source (one directory of numbered files per writer) that are complete:
    their writer has started the next file, or the generator has finished (all_complete)."""
    if not source.is_dir():
        return []
    complete = []
    for writer in sorted(source.iterdir()):
        files = sorted(writer.glob("*.jsonl"))
        complete += files if all_complete else files[:-1]
    return complete


def ship_file(path: Path, target: Path) -> Path:
    destination = target / path.parent.name / path.name
    destination.parent.mkdir(parents=True, exist_ok=True)
    os.link(path, destination)
    return destination


def ship_completed_files(source: Path, target: Path, shipped: set[Path], all_complete: bool) -> int:
    """Hard-link into target every complete log file under source (`complete_files`). The file
    source reads a file once, when it first lists it, so it must see only complete files; this is
    what a log shipper moving closed files into the watched directory does."""
    linked = 0
    for path in complete_files(source, all_complete):
        if path not in shipped:
            ship_file(path, target)
            shipped.add(path)
            linked += 1
    return linked


def newly_complete(source: Path, next_seq: dict[str, int], all_complete: bool) -> list[Path]:
    """The log files under source that became complete since the last call (`complete_files`), found
    without listing the writers' directories: a writer's files are numbered from 00000.jsonl in the
    order written (photon gen, benchmarks/replay.py), so file n is complete once file n + 1 exists (or
    the generator is done). `next_seq` (writer name -> the first file not yet returned) is kept by
    the caller. At 8,000 clicks/s a writer rotates ~25 files a second: a listing of its directory
    every poll would grow to tens of thousands of entries."""
    if not source.is_dir():
        return []
    found = []
    for writer in sorted(source.iterdir()):
        seq = next_seq.get(writer.name, 0)
        while (writer / f"{seq:05d}.jsonl").exists() and (
                all_complete or (writer / f"{seq + 1:05d}.jsonl").exists()):
            found.append(writer / f"{seq:05d}.jsonl")
            seq += 1
        next_seq[writer.name] = seq
    return found


class Shipper:
    """A thread that ships the complete log files of both streams into shipped_root every
    poll_seconds, each the moment it is complete (`newly_complete`), until the generator has written
    its summary: then the last files are shipped and it ends."""

    STREAMS = ("query", "click")

    def __init__(self, data_dir: Path, datacenter: str, shipped_root: Path, poll_seconds: float = 0.2):
        self.data_dir, self.datacenter, self.root, self.poll_seconds = data_dir, datacenter, shipped_root, poll_seconds
        self.shipped: set[Path] = set()
        self.failure: list[BaseException] = []
        self.next_seq: dict[str, dict[str, int]] = {stream: {} for stream in self.STREAMS}
        for stream in self.STREAMS:
            stream_dir(shipped_root, datacenter, stream).mkdir(parents=True, exist_ok=True)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def complete(self, stream: str, done: bool) -> list[Path]:
        return newly_complete(stream_dir(self.data_dir, self.datacenter, stream), self.next_seq[stream], done)

    def _run(self) -> None:
        try:
            while True:
                # Read before listing: once the summary exists, every file listed after is complete.
                done = (self.data_dir / SUMMARY_FILE).exists()
                for stream in self.STREAMS:
                    for path in self.complete(stream, done):
                        ship_file(path, stream_dir(self.root, self.datacenter, stream))
                        self.shipped.add(path)
                if done:
                    return
                time.sleep(self.poll_seconds)
        except BaseException as error:  # surfaced in the main thread
            self.failure.append(error)

    def start(self) -> "Shipper":
        self.thread.start()
        return self

    def wait(self, timeout_seconds: float, stop) -> None:
        """Until the last shipment; on a failure or the timeout, calls stop() and raises."""
        self.thread.join(timeout_seconds)
        if self.failure or self.thread.is_alive():
            stop()
            if self.failure:
                raise self.failure[0]
            raise SystemExit(f"the generator had not finished after {timeout_seconds} s")


class OrderedShipper(Shipper):
    """The shipper for Flink's file source, which does not read the files it has found in the order
    they came: its split assigner hands out the last split added first (a list it adds to and takes
    from at the front), and those of its first listing in hash order. With every complete file
    shipped at once, a job behind by a minute at 1,000 clicks/s read some query files 1 s after they
    were written and others 216 s after. This shipper sends each stream's complete files oldest
    first (by modification time) in batches of at most batch_files, the next batch once the job has
    read every file of the last one (Flink's log: flink_join.LogFollower): out of order only within
    a batch (32 query files: about 2.5 s of queries at 10,000/s), as a log broker's partition would
    deliver them."""

    def __init__(self, data_dir: Path, datacenter: str, shipped_root: Path, flink_log_dir: Path,
                 poll_seconds: float = 0.2, batch_files: int = 32):
        super().__init__(data_dir, datacenter, shipped_root, poll_seconds)
        try:
            from benchmarks.flink_join import LogFollower
        except ImportError:  # run as a script without the repository on the path
            from flink_join import LogFollower
        self.log, self.batch_files = LogFollower(flink_log_dir), batch_files
        self.unread: dict[str, set[str]] = {stream: set() for stream in self.STREAMS}
        self.pending: dict[str, list[Path]] = {stream: [] for stream in self.STREAMS}

    def _run(self) -> None:
        try:
            while True:
                done = (self.data_dir / SUMMARY_FILE).exists()
                self.log.poll()
                left = 0
                for stream in self.STREAMS:
                    unread = self.unread[stream]
                    unread -= unread & self.log.finished.keys()
                    pending = self.pending[stream]
                    pending.extend(self.complete(stream, done))
                    pending.sort(key=lambda p: (p.stat().st_mtime, p.name))
                    room = 0 if unread else self.batch_files
                    shipping, self.pending[stream] = pending[:room], pending[room:]
                    for path in shipping:
                        destination = ship_file(path, stream_dir(self.root, self.datacenter, stream))
                        self.shipped.add(path)
                        if path.stat().st_size > 0:  # Flink may make no split of an empty file
                            unread.add(str(destination))
                    left += max(0, len(pending) - room)
                if done and not left:
                    return
                time.sleep(self.poll_seconds)
        except BaseException as error:  # surfaced in the main thread
            self.failure.append(error)


def floor_streams(spark, shipped_root: Path, datacenter: str):
    """The no-join floor's two streams: the same file sources as the join, clicks with the columns the
    join writes, queries parsed and dropped (the `noop` sink): the input path's cost without the join."""
    clicks = (json_stream(spark, stream_dir(shipped_root, datacenter, "click"), CLICK_SCHEMA, None)
              .select("click_id", "query_id", "timestamp_us", "ad_id", "advertiser_id", "cost_micros"))
    queries = json_stream(spark, stream_dir(shipped_root, datacenter, "query"), QUERY_SCHEMA, None)
    return clicks, queries


def run_streaming_live(data_dir: Path, out_dir: Path, datacenter: str = "dc1", watermark: str = DEFAULT_BOUND,
                       join_window: str = DEFAULT_BOUND, poll_seconds: float = 0.2,
                       timeout_seconds: float = 3600, driver_memory: str = STREAMING_DRIVER_MEMORY,
                       shuffle_partitions: int = STREAMING_LIVE_SHUFFLE_PARTITIONS, trigger_seconds: float = 0,
                       state_store: str = "rocksdb", jvm_options: str = "", no_join: bool = False) -> dict:
    """The stream-stream join of `run_streaming`, run continuously while `photon gen --follow`
    writes the logs: by default the default trigger (a micro-batch as soon as the previous one ends:
    as fast as it keeps up; `trigger_seconds` > 0 sets a processing-time trigger), every new file in
    each micro-batch, the Delta sink committing each one. Complete files are shipped into its source
    directories every poll_seconds; once the generator has written its summary, the last files are
    shipped, everything available is processed and the query stops.

    The table is left in out_dir/streaming-live/joined_clicks, whose Delta log gives each click's
    visible time, as for Photon.

    `no_join`: the no-join floor (`floor_streams`): the same sources and sink, clicks written as read,
    queries read and dropped by a second query of the same session; nothing joined, deduplicated or
    held in state. `state_store` (rocksdb, hdfs) and `jvm_options` (the session JVM's) for the sweeps."""
    spark, session_start_seconds = timed_session(
        None, lambda: streaming_session(driver_memory, shuffle_partitions, state_store, jvm_options))
    data_dir, out = Path(data_dir), Path(out_dir) / "streaming-live"
    shutil.rmtree(out, ignore_errors=True)
    shipped_root = out / "shipped"
    shipper = Shipper(data_dir, datacenter, shipped_root, poll_seconds)
    table = out / "joined_clicks"
    conf = streaming_conf(shuffle_partitions, state_store)
    trigger = (f"processingTime {trigger_seconds:g} s" if trigger_seconds
               else "default (next micro-batch as soon as the previous one ends)")

    with session_conf(spark, {**conf, "spark.sql.streaming.numRecentProgressUpdates": "1000000"}):
        if no_join:
            frame, dropped = floor_streams(spark, shipped_root, datacenter)
            extra = [dropped.writeStream.format("noop").option("checkpointLocation", str(out / "checkpoint-queries"))]
        else:
            frame, extra = joined_click_stream(spark, shipped_root, datacenter, watermark, join_window, None), []
        writers = [frame.writeStream.format("delta").outputMode("append")
                   .option("checkpointLocation", str(out / "checkpoint")), *extra]
        if trigger_seconds:
            writers = [w.trigger(processingTime=f"{trigger_seconds:g} seconds") for w in writers]
        query = writers[0].start(str(table))
        others = [w.start() for w in writers[1:]]

        def stop_all() -> None:
            for q in (query, *others):
                q.stop()
        shipper.start().wait(timeout_seconds, stop_all)
        for q in (query, *others):
            q.processAllAvailable()
        stop_all()
        progress = [batch for batch in query.recentProgress if batch["numInputRows"] > 0]
        ids = [row.click_id for row in spark.read.format("delta").load(str(table)).select("click_id").collect()]
    joined_rows, joined_ids = len(ids), set(ids)
    batch_seconds = sorted(batch["durationMs"]["triggerExecution"] / 1e3 for batch in progress)
    return {
        "peer": "spark_structured_streaming_live" + ("_floor" if no_join else ""),
        "spark_version": spark.version,
        "settings": streaming_settings(spark, conf, watermark=watermark, join_window=join_window, trigger=trigger,
                                       no_join=no_join, jvm_options=jvm_options,
                                       state_store=state_store),
        "watermark": watermark,
        "join_window": join_window,
        "trigger": trigger,
        "state_store": conf["spark.sql.streaming.stateStore.providerClass"].rsplit(".", 1)[1],
        "session_start_seconds": session_start_seconds,
        "files_shipped": len(shipper.shipped),
        "micro_batches_with_input": len(progress),
        "micro_batch_seconds": {"p50": batch_seconds[len(batch_seconds) // 2] if batch_seconds else None,
                                "max": batch_seconds[-1] if batch_seconds else None,
                                "mean": round(sum(batch_seconds) / len(batch_seconds), 3) if batch_seconds else None},
        "input_rows": sum(batch["numInputRows"] for batch in progress),
        "rows_dropped_by_watermark": rows_dropped_by_watermark(progress),
        "joined_rows": joined_rows,
        "joined_distinct_clicks": len(joined_ids),
        "duplicates_in_one_run": joined_rows - len(joined_ids),
        "jvm_peak_rss_bytes": jvm_peak_rss_bytes(spark),
        "table": str(table),
        "correctness": compare_with_truth(joined_ids, ground_truth(data_dir)),
    }


# -- Apache Flink: the interval join, backlog and live --------------------------

# PyFlink pins pyarrow, pandas, py4j and apache-beam to versions the project's .venv cannot share:
# Flink has a virtual environment of its own (scripts/setup.sh), and its job is a script run there.
FLINK_PYTHON = REPO / ".venv-flink" / "bin" / "python"
FLINK_JOB = Path(__file__).resolve().parent / "flink_join.py"
FLINK_JARS_DIR = REPO / ".cache" / "flink-jars"
FLINK_HEAP = "8g"
# Live, the heap state backend had the best p90 of the tuning sweeps (17.3 s over 240 s, against 78.4 s
# for RocksDB with checkpoints every 2 s: 2026-11-26-peer-tuning-flink-240s.json), and filled the 8 GiB
# heap with 240 s of queries; a long run holds up to the watermark plus the join window (600 s) of
# them: a heap of 16 GiB of this 24 GiB machine.
FLINK_LIVE_HEAP = "16g"


def event_time_span_seconds(truth: dict) -> float:
    """How far apart in event time two lines of the workload can be: the queries' span and the
    longest click delay (follow mode: the run and the late writers' delay too)."""
    config = truth["config"]
    span = config["duration_s"] + config["late_delay_s"] if config.get("follow") else config["span_seconds"]
    return float(span + config["click_delay_max_s"])


def flink_environment_missing() -> str | None:
    """Why Flink cannot run here (its virtual environment, which scripts/setup.sh installs), or None."""
    return None if FLINK_PYTHON.exists() else f"Flink's virtual environment is missing ({FLINK_PYTHON}): run scripts/setup.sh"


def flink_job(mode: str, logs: Path, out: Path, options: dict, shipping_done: Path | None = None,
              background: bool = False):
    """flink_join.py in Flink's virtual environment: its JSON result, or (background) the process."""
    import subprocess

    if missing := flink_environment_missing():
        raise SystemExit(missing)
    command = [str(FLINK_PYTHON), str(FLINK_JOB), mode, "--logs", str(logs), "--out", str(out),
               "--jars", str(FLINK_JARS_DIR)]
    for key, value in options.items():
        if key == "no_join":
            command += ["--no-join"] if value else []
        elif value is False:
            command.append(f"--no-{key.replace('_', '-')}")
        elif value is not None and value is not True:
            command += [f"--{key.replace('_', '-')}", str(value)]
    if shipping_done is not None:
        command += ["--shipping-done", str(shipping_done)]
    # Its own interpreter and packages only: nothing of this process's environment's Python.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    if background:
        return process
    return flink_result(process)


def flink_result(process) -> dict:
    stdout = process.communicate()[0]
    if process.returncode != 0 or not stdout.strip():
        raise SystemExit(f"flink_join.py exited {process.returncode}; its log is in the output directory's flink-log/")
    return json.loads(stdout.strip().splitlines()[-1])


def parquet_click_ids(table: Path) -> list[str]:
    """The click_id of every row of the committed part files (hidden in-progress files are not
    read: pyarrow skips names starting with '.' or '_')."""
    import pyarrow.parquet as pq

    if not table.is_dir() or not any(p.name.startswith("part-") for p in table.iterdir()):
        return []
    return pq.read_table(table, columns=["click_id"]).column("click_id").to_pylist()


def flink_summary(job: dict, data_dir: Path, datacenter: str, truth: dict) -> dict:
    """The peers' common fields from the job's output table and the ground truth."""
    table = Path(job["table"])
    ids = parquet_click_ids(table)
    joined_rows, joined_ids = len(ids), set(ids)
    committed = [p for p in table.iterdir() if p.name.startswith("part-")] if table.is_dir() else []
    return {
        **job,
        "joined_rows": joined_rows,
        "joined_distinct_clicks": len(joined_ids),
        "duplicates_in_one_run": joined_rows - len(joined_ids),
        "output_files": len(committed),
        "output_bytes": sum(p.stat().st_size for p in committed),
        "checkpoint_bytes": tree_bytes(table.parent / "checkpoints"),
        "input_bytes": input_bytes(data_dir, datacenter),
        "correctness": compare_with_truth(joined_ids, truth),
    }


def flink_options(watermark_seconds, join_window_seconds, checkpoint_seconds, parallelism, state_backend,
                  heap, dedup_ttl_seconds, input_counts, incremental_checkpoints=True, jvm_options="",
                  no_join=False) -> dict:
    return {"watermark_seconds": watermark_seconds, "join_window_seconds": join_window_seconds,
            "checkpoint_seconds": checkpoint_seconds, "parallelism": parallelism, "state_backend": state_backend,
            "heap": heap, "dedup_ttl_seconds": dedup_ttl_seconds, "input_counts": input_counts,
            "incremental_checkpoints": incremental_checkpoints, "jvm_options": jvm_options or None,
            "no_join": no_join}


def run_flink(data_dir: Path, out_dir: Path, datacenter: str = "dc1", watermark_seconds: float | None = None,
              join_window_seconds: float = CLICK_DELAY_MAX_SECONDS, checkpoint_seconds: float = 5.0,
              parallelism: int = 1, state_backend: str = "hashmap", heap: str = FLINK_HEAP,
              dedup_ttl_seconds: float = 0.0, input_counts: bool = True, incremental_checkpoints: bool = True,
              jvm_options: str = "", no_join: bool = False) -> dict:
    """Flink's interval join over the backlog: bounded file sources in streaming mode, exactly-once
    checkpoints, until every file is read and the last part files are committed.

    Default watermark: the workload's whole event-time span (`event_time_span_seconds`, 3,900 s for
    a batch workload), not the 300 s of the click delay. A bounded file source hands its files to
    the reader in no particular order (its split assigner keeps them in a hash set), so a writer's
    last file can be read before another's first: the disorder the watermark must cover is the
    span of the backlog. With 300 s, the 2,000-query test workload (one file per writer) joined 44
    to 52 of its 183 clicks in three runs, a 200,000-query backlog (279 files) 1,829 of 19,919;
    with the span, all of them. The price is state: nothing leaves the join's state before the end.

    Default state backend: the heap (`hashmap`), which holds that state in the 8 GiB heap and took
    17 s for the 200,000-query backlog where RocksDB took 43 s (same machine, minutes apart).
    Parallelism 2 was no faster (18 s) on 2 cores."""
    data_dir, out = Path(data_dir), Path(out_dir) / "flink"
    shutil.rmtree(out, ignore_errors=True)
    truth = ground_truth(data_dir)
    if watermark_seconds is None:
        watermark_seconds = event_time_span_seconds(truth)
    options = flink_options(watermark_seconds, join_window_seconds, checkpoint_seconds, parallelism, state_backend,
                            heap, dedup_ttl_seconds, input_counts, incremental_checkpoints, jvm_options, no_join)
    job = flink_job("backlog", data_dir / "logs" / datacenter, out, options)
    result = flink_summary(job, data_dir, datacenter, truth)
    wall = result["wall_seconds"]
    result["input_mb_per_second"] = round(result["input_bytes"] / MB / wall, 2)
    result["joined_clicks_per_second"] = round(result["joined_rows"] / wall, 1)
    return result


def run_flink_live(data_dir: Path, out_dir: Path, datacenter: str = "dc1",
                   watermark_seconds: float = CLICK_DELAY_MAX_SECONDS,
                   join_window_seconds: float = CLICK_DELAY_MAX_SECONDS, checkpoint_seconds: float = 1.0,
                   parallelism: int = 2, state_backend: str = "hashmap", heap: str = FLINK_LIVE_HEAP,
                   dedup_ttl_seconds: float | None = None, input_counts: bool = True, poll_seconds: float = 0.2,
                   timeout_seconds: float = 3600, batch_files: int = 32, incremental_checkpoints: bool = True,
                   jvm_options: str = "", no_join: bool = False, shipper: str = "immediate") -> dict:
    """Flink's interval join left running while `photon gen --follow` writes the logs: its sources
    list their directories every second for new files, into which complete log files are shipped
    as for `streaming-live` (a file source reads a file once): by default each the moment it is
    complete (`Shipper`, shipper="immediate", issue 73: the files rotated small by the caller), or
    (shipper="ordered", before issue 73) oldest first in batches of at most batch_files per stream,
    the next once the job has read the last (`OrderedShipper`). After the last shipment the job runs
    until it has read every shipped file and committed what it wrote (flink_join.py), and stops.

    A click is visible when the part file holding it is committed: renamed from its hidden
    in-progress name when a checkpoint completes, every `checkpoint_seconds` (default 1 s: the
    latency is about the interval plus the checkpoint's own time). The rename sets the file's
    ctime, which `benchmarks/run.py live` reads as the commit time.

    Default watermark and join window: the click delay bound (300 s). Files arrive here in the
    order they are completed, a few seconds apart across writers, and the late writers' lines 60 s
    behind (`photon gen --late-delay-s`): within the bound. The dedup state is kept for the
    watermark plus the join window by default (processing time; duplicates come within 30 s).

    Default parallelism 2, one per core: at 1,000 clicks/s on a loaded machine (load average 7-8),
    with parallelism 1 the job fell behind (p90 per 10 s of click time from 41 s to 72 s over a
    minute; p50 42 s, p90 60 s), with 2 it held (p90 per 10 s from 27 s to 36 s, flat over the last 30 s; p50 26 s, p90 36 s)."""
    data_dir, out = Path(data_dir), Path(out_dir).resolve() / "flink-live"
    shutil.rmtree(out, ignore_errors=True)
    shipping = shipper
    if shipper == "ordered":
        shipper = OrderedShipper(data_dir, datacenter, out / "shipped", out / "flink-log", poll_seconds, batch_files)
    else:
        shipper = Shipper(data_dir, datacenter, out / "shipped", poll_seconds)
    if dedup_ttl_seconds is None:
        dedup_ttl_seconds = watermark_seconds + join_window_seconds
    options = flink_options(watermark_seconds, join_window_seconds, checkpoint_seconds, parallelism, state_backend,
                            heap, dedup_ttl_seconds, input_counts, incremental_checkpoints, jvm_options, no_join)
    shipping_done = out / "shipping-done"
    process = flink_job("live", out / "shipped" / "logs" / datacenter, out, {**options, "timeout_seconds": timeout_seconds},
                        shipping_done=shipping_done, background=True)
    shipper.start().wait(timeout_seconds, process.kill)
    shipping_done.write_text(json.dumps(sorted(str(p) for p in shipper.shipped)))
    job = flink_result(process)
    result = flink_summary(job, data_dir, datacenter, ground_truth(data_dir))
    result["files_shipped"] = len(shipper.shipped)
    result["shipper"] = shipping
    return result


# -- command line --------------------------------------------------------------

def jvm_options(value: str) -> str:
    """A peer's --jvm-options: 'photon' for Photon's own (photon_jvm_options)."""
    return photon_jvm_options() if value.strip() == "photon" else value

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    peers = parser.add_subparsers(dest="peer", required=True)
    for name in ("duckdb", "spark-batch", "streaming", "streaming-live", "flink", "flink-live"):
        sub = peers.add_parser(name)
        sub.add_argument("--data-dir", required=True, type=Path, help="a `photon gen` data directory")
        sub.add_argument("--out-dir", type=Path, help="where outputs go (default: a temporary directory, removed)")
        sub.add_argument("--datacenter", default="dc1", help="the log replica to read")
    for name in ("streaming", "streaming-live"):
        sub = peers.choices[name]
        sub.add_argument("--watermark", default=DEFAULT_BOUND, help="event-time delay of both watermarks")
        sub.add_argument("--join-window", default=DEFAULT_BOUND, help="click time <= query time + this")
        sub.add_argument("--driver-memory", default=STREAMING_DRIVER_MEMORY, help="the peer's own session's")
        sub.add_argument("--shuffle-partitions", type=int,
                         default=STREAMING_SHUFFLE_PARTITIONS if name == "streaming" else STREAMING_LIVE_SHUFFLE_PARTITIONS,
                         help="also the state store instances per stateful operator")
    for name in ("flink", "flink-live"):
        sub = peers.choices[name]
        sub.add_argument("--watermark-seconds", type=float,
                         default=None if name == "flink" else CLICK_DELAY_MAX_SECONDS,
                         help="bounded out-of-orderness of both sources (flink: default the workload's "
                              "event-time span; flink-live: the click delay bound)")
        sub.add_argument("--join-window-seconds", type=float, default=CLICK_DELAY_MAX_SECONDS,
                         help="click time <= query time + this")
        sub.add_argument("--checkpoint-seconds", type=float, default=5.0 if name == "flink" else 1.0)
        sub.add_argument("--parallelism", type=int, default=1 if name == "flink" else 2)
        sub.add_argument("--state-backend", choices=("rocksdb", "hashmap"), default="hashmap",
                         help="the heap (the fastest while the state fits it: the backlog's runs and the live tuning "
                              "sweeps), or RocksDB with incremental checkpoints")
        sub.add_argument("--heap", default=FLINK_HEAP if name == "flink" else FLINK_LIVE_HEAP,
                         help="the local Flink cluster's JVM heap")
        sub.add_argument("--dedup-ttl-seconds", type=float,
                         default=0.0 if name == "flink" else None,
                         help="processing time the dedup state keeps a click_id (0: the whole run; "
                              "flink-live default: watermark + join window)")
        sub.add_argument("--no-input-counts", dest="input_counts", action="store_false",
                         help="skip reading the input back afterwards to count bad lines")
    for name in ("streaming-live", "flink-live"):
        peers.choices[name].add_argument("--timeout-seconds", type=float, default=3600,
                                         help="give up if the generator has not finished by then")
        peers.choices[name].add_argument("--no-join", action="store_true",
                                         help="the no-join floor: the same input path and sink, clicks written as read")
        peers.choices[name].add_argument("--jvm-options", default="",
                                         help="options for the peer's JVM (default none: Java's own); "
                                              "'photon' for Photon's collector and JIT thresholds")
    peers.choices["streaming-live"].add_argument("--state-store", choices=sorted(STATE_STORES), default="rocksdb")
    flink_live = peers.choices["flink-live"]
    flink_live.add_argument("--no-incremental-checkpoints", dest="incremental_checkpoints", action="store_false",
                            help="RocksDB: snapshot the whole state at each checkpoint")
    flink_live.add_argument("--shipper", choices=("immediate", "ordered"), default="immediate",
                            help="each complete file at once, or oldest first in batches of 32 with a wait (before issue 73)")
    peers.choices["streaming-live"].add_argument("--trigger-seconds", type=float, default=0,
                                                 help="processing-time trigger; 0: the default trigger")
    streaming = peers.choices["streaming"]
    streaming.add_argument("--max-files-per-trigger", type=int, default=4,
                           help="files per source and micro-batch; 0: no limit (the backlog in one micro-batch)")
    streaming.add_argument("--no-replay", dest="replay", action="store_false",
                           help="skip the replay with a fresh checkpoint (the duplicate experiment)")
    args = parser.parse_args()

    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="photon-peers-"))
    try:
        if args.peer == "duckdb":
            result = run_duckdb(args.data_dir, out_dir, args.datacenter)
        elif args.peer == "spark-batch":
            result = run_spark_batch(args.data_dir, out_dir, args.datacenter)
        elif args.peer == "streaming-live":
            result = run_streaming_live(args.data_dir, out_dir, args.datacenter, args.watermark, args.join_window,
                                        timeout_seconds=args.timeout_seconds, driver_memory=args.driver_memory,
                                        shuffle_partitions=args.shuffle_partitions,
                                        trigger_seconds=args.trigger_seconds, state_store=args.state_store,
                                        jvm_options=jvm_options(args.jvm_options), no_join=args.no_join)
        elif args.peer == "streaming":
            result = run_streaming(args.data_dir, out_dir, args.datacenter, args.watermark, args.join_window,
                                   args.max_files_per_trigger or None, replay=args.replay,
                                   driver_memory=args.driver_memory, shuffle_partitions=args.shuffle_partitions)
        else:
            options = flink_options(args.watermark_seconds, args.join_window_seconds, args.checkpoint_seconds,
                                    args.parallelism, args.state_backend, args.heap, args.dedup_ttl_seconds,
                                    args.input_counts)
            if args.peer == "flink":
                result = run_flink(args.data_dir, out_dir, args.datacenter, **options)
            else:
                options.update(incremental_checkpoints=args.incremental_checkpoints,
                               jvm_options=jvm_options(args.jvm_options), no_join=args.no_join)
                result = run_flink_live(args.data_dir, out_dir, args.datacenter, **options,
                                        timeout_seconds=args.timeout_seconds, shipper=args.shipper)
    finally:
        if args.out_dir is None:
            shutil.rmtree(out_dir, ignore_errors=True)
    print(json.dumps(result, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
