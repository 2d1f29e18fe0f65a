"""Spark with Delta Lake, in one of two modes chosen by configuration:

- local: an in-process session (`local[2]`), created once per process and shared by every run in it;
- connect: a client of a long-lived Spark Connect server (resources/spark/connect_server.py starts one), so
  a run in a process of its own pays ~0.3 s to connect instead of a JVM start.

The pipeline's code is the same in both: DataFrames, Delta through SQL and writer options, no
`sparkContext`, RDD or py4j call (the Connect client has none). Delta's JVM jars are fetched from
Maven Central by scripts/setup.sh into `.cache/jars` and loaded from there, never over the network.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dagster_pyspark import LazyPySparkResource
from pyspark.sql import SparkSession

from resources.spark.class_archive import DELTA_JARS, archive_options
from resources.spark.class_archive import JARS_DIR as DEFAULT_JARS_DIR
from resources.spark.log_store import CLASS_NAME as LOG_STORE_CLASS
from resources.spark.log_store import log_store_jar
from resources.runtime.priority import off_click_path
from resources.spark.task_priority import OFF_CLICK_PATH_TAG, plugin_conf, plugin_jar, priority_options

# `sc://HOST:PORT` of the Spark Connect server every run of this deployment uses; unset: local mode.
SPARK_REMOTE_ENV = "PHOTON_SPARK_REMOTE"
# Extra options for the JVMs that run the pipeline (a local session's or the Connect server's driver,
# a cluster's executors), e.g. the C1-only compiling the test suite sets (docs/STACK.md).
JVM_OPTIONS_ENV = "PHOTON_JVM_OPTIONS"

_session_lock = threading.Lock()


def delta_jars(jars_dir: Path = DEFAULT_JARS_DIR) -> list[str]:
    """Delta's jars, the project's log store for it (resources/spark/log_store.py) and its task priority plugin
    (resources/spark/task_priority.py)."""
    jars = [jars_dir / name for name in DELTA_JARS]
    missing = [str(j) for j in jars if not j.is_file()]
    if missing:
        raise RuntimeError(f"Delta jars missing ({', '.join(missing)}): run scripts/setup.sh first")
    return [*map(str, jars), str(log_store_jar(jars_dir)), str(plugin_jar(jars_dir))]


# Commits atomic across processes, so that OPTIMIZE holds no table lock (resources/spark/log_store.py).
LOG_STORE_CONF = {"spark.delta.logStore.file.impl": LOG_STORE_CLASS}
# The JVM's heap. Its peak in a live run at 1,000 clicks/s or on the 2 M-query backlog stays well
# under it; the whole pipeline (JVM, Python, registry service with the EventStore's memory tier) is
# meant to stay within 4 GiB (benchmarks/run.py live measures it).
DRIVER_MEMORY = "2g"
# A file Delta's OPTIMIZE rewrites: smaller than this (Delta's default, 1 GiB, rewrote every earlier
# compaction of a growing table again in each one: a live click_ledger's took 8.9 s at minute 10 and
# 12.8 s at minute 12, holding the table's lock, so a click run waited for it). Table maintenance counts
# only such files toward its next compaction (photon_assets/maintenance.py).
SMALL_FILE_BYTES = 16 * 1024 * 1024
# The default pool's jobs scheduled FAIR, not FIFO (the file says why).
SCHEDULER_POOLS_FILE = Path(__file__).with_name("spark_pools.xml")


# Columns with a value per row: Parquet fills a dictionary for each until it outgrows its page and falls
# back to plain encoding, so the files come out the same without it (the backlog's warehouse within
# 0.01 %), and the hashing is spared: 5-10 % of the JVM's samples in the backlog (JFR), ~5 % of its
# time (benchmarks/README.md, issue 42 round six).
UNIQUE_COLUMNS = ("query_id", "click_id", "timestamp_us", "offset", "query.query_id", "query.timestamp_us",
                  "query_timestamp_us")


UI_RETENTION_CONF = {
    # The status store keeps the last 1,000 SQL executions, jobs and stages (plan strings,
    # metrics) even with the UI off. One session serves every run, and a 2 M-query backlog
    # filled a 4 GiB heap with them (Java heap space in a MERGE); a few dozen are enough for the
    # error messages that use them.
    "spark.sql.ui.retainedExecutions": "50",
    # A run's jobs are counted from the retained ones (SparkResource.jobs_counted).
    "spark.ui.retainedJobs": "200",
    "spark.ui.retainedStages": "100",
    "spark.ui.retainedTasks": "10000",
    "spark.ui.dagGraph.retainedRootRDDs": "100",
}

# How cached frames and Parquet files are encoded.
ENCODING_CONF = {
    # CPU, not memory, is what 2 cores lack (benchmarks/run.py backlog, profiled with JFR):
    # compressing persisted frames (a query unit's parsed lines, the EventStore's matches) took
    # 12% of the JVM's samples, twice the time of caching them uncompressed; and
    # dictionary-encoding the ads' ad_id, the column whose dictionary costs the most hashing,
    # 0.7 s per 800k query rows written (files 15% larger without it).
    "spark.sql.inMemoryColumnarStorage.compressed": "false",
    "spark.hadoop.parquet.enable.dictionary#ads.list.element.ad_id": "false",
    "spark.hadoop.parquet.enable.dictionary#query.ads.list.element.ad_id": "false",
    **{f"spark.hadoop.parquet.enable.dictionary#{column}": "false" for column in UNIQUE_COLUMNS},
}

# OPTIMIZE and VACUUM, which table maintenance runs (photon_assets/maintenance.py).
MAINTENANCE_CONF = {
    # OPTIMIZE rewrites the files under SMALL_FILE_BYTES (see there) into files of up to twice
    # that: one task writes each, side by side (a live joined_clicks's 70 MB of small files took
    # 22.3 s in the one task of Delta's default 1 GiB bin).
    "spark.databricks.delta.optimize.minFileSize": str(SMALL_FILE_BYTES),
    "spark.databricks.delta.optimize.maxFileSize": str(2 * SMALL_FILE_BYTES),
    # The query cache is vacuumed with a retention of minutes (settings.py), below Delta's 7-day
    # default; click runs never read snapshots older than that.
    "spark.databricks.delta.retentionDurationCheck.enabled": "false",
    # VACUUM lists a table's files with this many tasks (Spark's default: 10,000, ~1-2 minutes a
    # table on 2 cores, against seconds with a few).
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "8",
}


def delta_conf(shuffle_partitions: int = 4, jars_dir: Path = DEFAULT_JARS_DIR) -> dict[str, str]:
    """The settings of the JVM that runs the pipeline: a local session's or the Connect server's."""
    return {
        "spark.jars": ",".join(delta_jars(jars_dir)),
        **LOG_STORE_CONF,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.default.parallelism": str(shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.log.level": "ERROR",
        "spark.ui.showConsoleProgress": "false",
        **UI_RETENTION_CONF,
        # Small tables on few cores: rebuilding a Delta snapshot over 50 partitions is pure overhead.
        "spark.databricks.delta.snapshotPartitions": "2",
        # A pass uses ~180 compiled codes: Spark's default cache of 100 recompiled them all (docs/STACK.md).
        "spark.sql.codegen.cache.maxEntries": "1000",
        "spark.databricks.delta.stats.collect": "true",
        "spark.sql.adaptive.enabled": "true",
        # Concurrent runs share the cores job by job (spark_pools.xml): under FIFO, a click run's
        # jobs waited behind every task a query append or a compaction had queued first.
        "spark.scheduler.mode": "FAIR",
        "spark.scheduler.allocation.file": str(SCHEDULER_POOLS_FILE),
        **ENCODING_CONF,
        **MAINTENANCE_CONF,
        # Staged hand-offs (spark_ops/handoff.py) are written a few times a pass: version 2 of the
        # file committer moves task output into place once instead of twice (~0.1 s a write here).
        "spark.hadoop.mapreduce.fileoutputcommitter.algorithm.version": "2",
        # Python workers forked with the modules our tasks use already imported, and without the
        # Spark jar and pyspark's zips on their path, which each task's import cache reset re-read
        # (~0.1 s a task).
        "spark.python.daemon.module": "spark_ops.worker_daemon",
        **plugin_conf(),
        **jvm_options(),
    }


# A JVM option choosing the garbage collector (-XX:+UseSerialGC, -XX:+UseG1GC, ...).
COLLECTOR_OPTION = re.compile(r"-XX:\+Use\w+GC\b")
# The pipeline's JVMs' garbage collector, unless PHOTON_JVM_OPTIONS names one: the serial collector,
# which grows its old generation only when a full collection leaves too little free. Java's default,
# G1, grew each long-lived pipeline JVM into its whole 2 GiB heap: the Connect server of a live
# `photon up` to 2.18 GiB of PSS, against 1.19 GiB with this one (2026-11-30); `photon run`'s local
# session to 2.37 GiB, against 1.37 GiB with this one (the whole run's peak 4.28 against 3.34 GiB,
# 2026-12-02); the latency unchanged both times (docs/STACK.md; benchmarks/README.md, issue 42
# rounds twenty-three and twenty-seven).
COLLECTOR = "-XX:+UseSerialGC"
# How much free heap the collector keeps, unless PHOTON_JVM_OPTIONS says: after a full collection it
# grows the heap until at least MinHeapFreeRatio % is free and shrinks it while more than MaxHeapFreeRatio %
# is (Java's defaults, 40 and 70). A live `photon up`'s Connect server holds 130-350 MB after a full
# collection, yet one passing peak grew its heap from 374 to 637 MB for good (a 10-minute probe). With
# these bounds its peak PSS over 15 minutes at 1,000 clicks/s was 1.21 GiB, against 1.36-1.46 GiB in the
# two runs before (a probe whose queue also differed, since reverted: 2026-12-07, benchmarks/README.md).
HEAP_FREE_OPTION = re.compile(r"-XX:(Min|Max)HeapFreeRatio=")
HEAP_FREE_OPTIONS = ["-XX:MinHeapFreeRatio=20", "-XX:MaxHeapFreeRatio=40"]
# How the JIT compiles, unless PHOTON_JVM_OPTIONS says (any tiered-compilation option): C2 compiles
# a method once it ran ten times as often as Java's default asks. On two slow cores the one C2 thread
# could not keep up with what the pipeline warms (Spark's planning, Delta's commits, Janino, Parquet):
# 3,449 methods waited in its queue six minutes into a live `photon run`, and the compiler threads took
# 46 s of the JVM's 103 s of CPU in its minutes 2-4. With these thresholds, 18 s of 66 s; the click runs
# 6.7 s at the median against 11-22 s and p90 32.8 s against 50-67 s (5-minute probes at 1,000
# clicks/s, 2026-12-01, docs/STACK.md). The hot loops (Parquet encoding, Arrow) still reach C2 within
# seconds; C1 alone made them twice as slow.
JIT_OPTION = re.compile(r"-XX:[+-]?(Tier|TieredCompilation|TieredStopAtLevel|CompileThreshold)")
JIT_OPTIONS = ["-XX:Tier4InvocationThreshold=50000", "-XX:Tier4MinInvocationThreshold=6000",
               "-XX:Tier4CompileThreshold=150000", "-XX:Tier4BackEdgeThreshold=400000"]
# Arrow's bounds and null checks on every access, unless PHOTON_JVM_OPTIONS sets them: 12 % of the
# JVM's Java samples in a live click run (JFR: ArrowBuf.checkIndexD, refCnt, ensureAccessible) as Spark
# reads the Python workers' Arrow batches. Spark reads a value only after its validity (isNullAt).
ARROW_OPTION = re.compile(r"-Darrow\.")
ARROW_OPTIONS = ["-Darrow.enable_unsafe_memory_access=true", "-Darrow.enable_null_check_for_get=false"]


# Photon's JVM options, in order, each with what in PHOTON_JVM_OPTIONS replaces it.
DEFAULT_JVM_OPTIONS = [(COLLECTOR_OPTION, [COLLECTOR]), (HEAP_FREE_OPTION, HEAP_FREE_OPTIONS), (JIT_OPTION, JIT_OPTIONS),
                       (ARROW_OPTION, ARROW_OPTIONS)]


def jvm_options() -> dict[str, str]:
    """PHOTON_JVM_OPTIONS and the class archive (resources/spark/class_archive.py) for the driver, and for
    executors where they are JVMs of their own (a standalone cluster's); before them, DEFAULT_JVM_OPTIONS,
    each unless PHOTON_JVM_OPTIONS has one of its own, and the mapping of thread priorities where the task
    priority plugin is loaded (resources/spark/task_priority.py)."""
    user_options = os.environ.get(JVM_OPTIONS_ENV, "").strip()
    chosen = [o for replaced_by, defaults in DEFAULT_JVM_OPTIONS if not replaced_by.search(user_options) for o in defaults]
    options = " ".join(o for o in [*chosen, *priority_options(), user_options, *archive_options(user_options)] if o)
    return {"spark.driver.extraJavaOptions": options, "spark.executor.extraJavaOptions": options}


def local_conf(master: str = "local[2]", shuffle_partitions: int = 4, driver_memory: str = DRIVER_MEMORY) -> dict[str, str]:
    return {
        "spark.master": master,
        "spark.app.name": "photon",
        "spark.driver.memory": driver_memory,
        # A local session talks to itself only: keep the driver on loopback.
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.ui.enabled": "false",
        **delta_conf(shuffle_partitions),
    }


def _prepare_local_process() -> None:
    # Python workers must run this interpreter (the project's venv); pyspark reads the variable.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def delta_session(master: str = "local[2]", shuffle_partitions: int = 4, driver_memory: str = DRIVER_MEMORY) -> SparkSession:
    """The process's local Spark session with Delta's SQL extension and catalog.

    getOrCreate returns an existing session unchanged (its static settings cannot change), so the
    first caller's settings win; every caller in this project passes the same ones.
    """
    with _session_lock:
        active = SparkSession.getActiveSession()
        if active is not None:
            return active
        _prepare_local_process()
        builder = SparkSession.builder
        for key, value in local_conf(master, shuffle_partitions, driver_memory).items():
            builder = builder.config(key, value)
        return builder.getOrCreate()


class SparkResource(LazyPySparkResource):
    """dagster-pyspark's lazy session: it starts on first use, not when a run starts. Its
    `spark_config` decides the mode: with `spark.remote`, a Spark Connect client; otherwise a local
    session for the process, so the in-process run launcher of `photon run` pays the JVM start once.
    Build it with `local()` or `connect()`, or from the environment with `spark_resource_from_env()`."""

    @classmethod
    def local(cls, master: str = "local[2]", shuffle_partitions: int = 4, driver_memory: str = DRIVER_MEMORY) -> SparkResource:
        return cls(spark_config=local_conf(master, shuffle_partitions, driver_memory))

    @classmethod
    def connect(cls, remote: str) -> SparkResource:
        return cls(spark_config={"spark.remote": remote})

    @property
    def remote(self) -> str | None:
        return self.spark_config.get("spark.remote")

    def session(self) -> SparkSession:
        """The session; for work off the click path (resources/runtime/priority.py), with this thread's
        operations tagged so that their tasks run at its lower priority (resources/spark/task_priority.py)."""
        with _session_lock:
            if self.remote is None:
                _prepare_local_process()
            session = self.spark_session
        if off_click_path() and OFF_CLICK_PATH_TAG not in session.getTags():
            session.addTag(OFF_CLICK_PATH_TAG)
        return session

    @contextmanager
    def jobs_counted(self, group: str) -> Iterator[Callable[[], dict[str, int]]]:
        """The Spark jobs this thread starts inside the block (Delta's own included), as run metadata:
        yields a function giving {"spark_jobs": n}. Local mode only, where the session's status
        tracker counts them under a job group; a Connect client has no status tracker, and gives {}."""
        session = self.session()
        if self.remote is not None:
            yield dict
            return
        context = session.sparkContext
        context.setJobGroup(group, group)
        try:
            yield lambda: {"spark_jobs": len(context.statusTracker().getJobIdsForGroup(group))}
        finally:
            context.setLocalProperty("spark.jobGroup.id", None)
            context.setLocalProperty("spark.job.description", None)


def spark_resource_from_env() -> SparkResource:
    """Connect mode when PHOTON_SPARK_REMOTE names a server, local mode otherwise."""
    remote = os.environ.get(SPARK_REMOTE_ENV)
    return SparkResource.connect(remote) if remote else SparkResource.local()


def spark_session() -> SparkSession:
    """The session of this process's mode (PHOTON_SPARK_REMOTE), for code outside a run."""
    return spark_resource_from_env().session()
