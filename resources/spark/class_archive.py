"""The JVM's class archive: the classes of Spark, Delta and Spark Connect that the pipeline loads, parsed,
verified and laid out once in a file every later JVM maps (Java's AppCDS, a dynamic archive).

A cold JVM loads ~26,000 classes from the jars in its first minutes, ~25 s of CPU on two cores
(docs/STACK.md); from the archive it maps most of them. scripts/setup.sh makes the archive
(photon/make_class_archive.py: a Connect server that dumps what it loaded while the demo workload runs
through it), and every JVM that runs the pipeline, a local session's or the Connect server's, uses it
when it exists (resources/spark/session.py: jvm_options). Both modes share one archive: it holds the Connect
server's classes and all the pipeline's.

The JVM checks the archive against its own build and class path and, when they do not match, loads
from the jars as without it (one warning line). The file's name carries a fingerprint of the Java
binary, pyspark and the jars Spark loads, so that setup makes a new archive when one of them changes
instead of leaving a stale one unused. Benchmark peers never get it: it is Photon's setting.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from functools import cache
from importlib.metadata import version
from pathlib import Path

from resources.state.layout import REPO_ROOT

ARCHIVE_DIR = REPO_ROOT / ".cache" / "jvm"
# Where scripts/setup.sh puts the jars Spark loads besides its own (Delta's); resources/spark/session.py loads
# them from here, and the archive's name follows them.
JARS_DIR = REPO_ROOT / ".cache" / "jars"
DELTA_SPARK_JAR, DELTA_STORAGE_JAR = "delta-spark_2.13-4.0.1.jar", "delta-storage-4.0.1.jar"
DELTA_JARS = (DELTA_SPARK_JAR, DELTA_STORAGE_JAR)
# Options that already decide the JVM's class sharing: given any of them, the archive is not added.
SHARING_OPTIONS = ("-Xshare", "SharedArchiveFile", "ArchiveClassesAtExit")


def java_binary() -> Path:
    """The `java` Spark's launcher runs: JAVA_HOME's, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not found:
        raise RuntimeError("Java 17 is required (java not found)")
    return Path(found).resolve()


@cache
def fingerprint() -> str:
    java = java_binary()
    stat = java.stat()
    jars = sorted(path.name for path in JARS_DIR.glob("*.jar")) if JARS_DIR.is_dir() else []
    parts = [str(java), str(stat.st_size), str(stat.st_mtime_ns), version("pyspark"), *jars]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


ARCHIVE_PREFIX, ARCHIVE_SUFFIX = "spark-", ".jsa"


def archive_path(archive_dir: Path | None = None) -> Path:
    return (archive_dir or ARCHIVE_DIR) / f"{ARCHIVE_PREFIX}{fingerprint()}{ARCHIVE_SUFFIX}"


def stale_archives(archive_dir: Path | None = None) -> list[Path]:
    """The archives made for an earlier Java, pyspark or set of jars: never used again."""
    current = archive_path(archive_dir)
    return [path for path in (archive_dir or ARCHIVE_DIR).glob(f"{ARCHIVE_PREFIX}*{ARCHIVE_SUFFIX}") if path != current]


def archive_in_use(user_options: str, archive_dir: Path | None = None) -> Path | None:
    """The archive the pipeline's JVMs map: this machine's, unless `user_options` (PHOTON_JVM_OPTIONS)
    already decide class sharing (e.g. `-Xshare:off`, or the training run's own dump)."""
    path = archive_path(archive_dir)
    if any(option in user_options for option in SHARING_OPTIONS) or not path.is_file():
        return None
    return path


def archive_options(user_options: str, archive_dir: Path | None = None) -> list[str]:
    """The JVM options that map the archive in use, if any."""
    path = archive_in_use(user_options, archive_dir)
    if path is None:
        return []
    # Java 17.0.15 maps archives at a random address by default (ArchiveRelocationMode=1) and then
    # patches every pointer in them: the whole 200 MB read and made private at each start. Mode 0 maps
    # them where they were made for (the JVM relocates only if that address is taken): pages are read
    # as classes are used, and stay shared between JVMs (docs/STACK.md).
    return ["-XX:+UnlockDiagnosticVMOptions", "-XX:ArchiveRelocationMode=0", f"-XX:SharedArchiveFile={path}"]
