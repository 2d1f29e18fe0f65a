"""Delta's log store for this project's tables: `photon.delta.LinkLogStore` (resources/spark/jvm/LinkLogStore.java).

A Delta commit is a log file that must appear only if no other writer made that version. Delta's own
store for local file systems keeps that promise within one JVM only (a check, then a rename, under a
Java lock); LinkLogStore keeps it across processes (a hard link, which fails when the name exists). So
a writer that holds no table lock, OPTIMIZE in table maintenance, can commit beside a click run of
another JVM without either commit replacing the other: the loser of a race gets the error Delta expects,
checks the winner's commit for conflicts and retries (docs/STACK.md, "One writer per log entry"). The
warehouse must be on a file system with hard links (any local Linux one is): elsewhere a commit
fails with the file system's error.

The class is compiled against the jars it extends (Delta's storage jar, Hadoop's client API in pyspark)
into `.cache/jars/photon-log-store-<hash of the source>.jar` (resources/spark/jvm_build.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark.find_spark_home import _find_spark_home

from resources.spark.class_archive import DELTA_STORAGE_JAR, JARS_DIR
from resources.spark.jvm_build import compiled_jar
from resources.spark.jvm_build import jar_path as source_jar_path

SOURCE = Path(__file__).with_name("jvm") / "LinkLogStore.java"
CLASS_NAME = "photon.delta.LinkLogStore"
JAR_PREFIX = "photon-log-store-"


def jar_path(jars_dir: Path = JARS_DIR) -> Path:
    return source_jar_path(SOURCE, JAR_PREFIX, jars_dir)


def log_store_jar(jars_dir: Path = JARS_DIR) -> Path:
    """The log store's jar for the current source, compiled first if missing."""
    class_path = [jars_dir / DELTA_STORAGE_JAR, *(Path(_find_spark_home()) / "jars").glob("hadoop-client-api-*.jar")]
    return compiled_jar(SOURCE, JAR_PREFIX, class_path, jars_dir)


if __name__ == "__main__":  # scripts/setup.sh
    print(f"Delta log store: {log_store_jar()}", file=sys.stderr)
