"""Spark session with Delta Lake, created once per process and shared by every run in it.

Delta's JVM jars are fetched from Maven Central by scripts/setup.sh into `.cache/jars` and loaded
from there with `spark.jars`, so that sessions never resolve packages over the network.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
from pydantic import PrivateAttr
from pyspark.sql import SparkSession

from resources.layout import REPO_ROOT

DEFAULT_JARS_DIR = REPO_ROOT / ".cache" / "jars"
DELTA_JARS = ("delta-spark_2.13-4.0.1.jar", "delta-storage-4.0.1.jar")

_session_lock = threading.Lock()


def delta_jars(jars_dir: Path = DEFAULT_JARS_DIR) -> list[str]:
    jars = [jars_dir / name for name in DELTA_JARS]
    missing = [str(j) for j in jars if not j.is_file()]
    if missing:
        raise RuntimeError(f"Delta jars missing ({', '.join(missing)}): run scripts/setup.sh first")
    return [str(j) for j in jars]


def delta_session(
    master: str = "local[2]",
    shuffle_partitions: int = 4,
    driver_memory: str = "4g",
    jars_dir: Path = DEFAULT_JARS_DIR,
) -> SparkSession:
    """The process's Spark session with Delta's SQL extension and catalog.

    getOrCreate returns an existing session unchanged (its static settings cannot change), so the
    first caller's settings win; every caller in this project passes the same ones.
    """
    with _session_lock:
        active = SparkSession.getActiveSession()
        if active is not None:
            return active
        # Python workers must run this interpreter (the project's venv); pyspark reads the variable.
        os.environ["PYSPARK_PYTHON"] = sys.executable
        # A local session talks to itself only: keep the driver on loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (
            SparkSession.builder.master(master)
            .appName("photon")
            .config("spark.jars", ",".join(delta_jars(jars_dir)))
            .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
            .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
            .config("spark.driver.memory", driver_memory)
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
            .config("spark.default.parallelism", str(shuffle_partitions))
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            # The status store keeps the last 1,000 SQL executions, jobs and stages (plan strings,
            # metrics) even with the UI off. One session serves every run of `photon run`, and a
            # 2 M-query backlog filled a 4 GiB heap with them (Java heap space in a MERGE); a few
            # dozen are enough for the error messages that use them.
            .config("spark.sql.ui.retainedExecutions", "50")
            # A run's jobs are counted from the retained ones (SparkResource.jobs_counted).
            .config("spark.ui.retainedJobs", "200")
            .config("spark.ui.retainedStages", "100")
            .config("spark.ui.retainedTasks", "10000")
            .config("spark.ui.dagGraph.retainedRootRDDs", "100")
            # Small tables on few cores: rebuilding a Delta snapshot over 50 partitions is pure overhead.
            .config("spark.databricks.delta.snapshotPartitions", "2")
            .config("spark.databricks.delta.stats.collect", "true")
            .config("spark.sql.adaptive.enabled", "true")
            # CPU, not memory, is what 2 cores lack (benchmarks/run.py backlog, profiled with JFR):
            # compressing persisted frames (a query unit's parsed lines, the EventStore's matches)
            # took 12% of the JVM's samples, twice the time of caching them uncompressed; and
            # dictionary-encoding the ads' ad_id, the column whose dictionary costs the most hashing,
            # 0.7 s per 800k query rows written (files 15% larger without it).
            .config("spark.sql.inMemoryColumnarStorage.compressed", "false")
            .config("spark.hadoop.parquet.enable.dictionary#ads.list.element.ad_id", "false")
            .config("spark.hadoop.parquet.enable.dictionary#query.ads.list.element.ad_id", "false")
            # The query cache is vacuumed with a retention of minutes (settings.py), below Delta's
            # 7-day default; click runs never read snapshots older than that.
            .config("spark.databricks.delta.retentionDurationCheck.enabled", "false")
        )
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        return session


class SparkResource(dg.ConfigurableResource):
    """Local Spark + Delta. The session starts on first use (not when a run starts), and lives for
    the process, so the in-process run launcher of `photon run` pays the JVM start once."""

    master: str = "local[2]"
    shuffle_partitions: int = 4
    driver_memory: str = "4g"

    _session: SparkSession | None = PrivateAttr(default=None)

    def session(self) -> SparkSession:
        if self._session is None:
            self._session = delta_session(self.master, self.shuffle_partitions, self.driver_memory)
        return self._session

    @contextmanager
    def jobs_counted(self, group: str) -> Iterator[Callable[[], int]]:
        """The Spark jobs this thread starts inside the block (Delta's own included), counted by the
        status tracker of the local session under a job group; yields a function giving the count."""
        context = self.session().sparkContext
        context.setJobGroup(group, group)
        try:
            yield lambda: len(context.statusTracker().getJobIdsForGroup(group))
        finally:
            context.setLocalProperty("spark.jobGroup.id", None)
            context.setLocalProperty("spark.job.description", None)
