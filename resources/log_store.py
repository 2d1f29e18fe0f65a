"""Delta's log store for this project's tables: `photon.delta.LinkLogStore` (resources/jvm/LinkLogStore.java).

A Delta commit is a log file that must appear only if no other writer made that version. Delta's own
store for local file systems keeps that promise within one JVM only (a check, then a rename, under a
Java lock); LinkLogStore keeps it across processes (a hard link, which fails when the name exists). So
a writer that holds no table lock, OPTIMIZE in table maintenance, can commit beside a click run of
another JVM without either commit replacing the other: the loser of a race gets the error Delta expects,
checks the winner's commit for conflicts and retries (docs/STACK.md, "One writer per log entry"). The
warehouse must be on a file system with hard links (any local Linux one is): elsewhere a commit
fails with the file system's error.

The class is compiled with the JDK's `javac` against the jars it extends (Delta's storage jar, Hadoop's
client API in pyspark) into `.cache/jars/photon-log-store-<hash of the source>.jar`: by scripts/setup.sh,
and by the first session that finds it missing (a source changed by a pull), in ~2 s.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from pyspark.find_spark_home import _find_spark_home

from resources.class_archive import DELTA_STORAGE_JAR, JARS_DIR

SOURCE = Path(__file__).with_name("jvm") / "LinkLogStore.java"
CLASS_NAME = "photon.delta.LinkLogStore"
JAR_PREFIX = "photon-log-store-"


def jar_path(jars_dir: Path = JARS_DIR) -> Path:
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    return jars_dir / f"{JAR_PREFIX}{digest}.jar"


def log_store_jar(jars_dir: Path = JARS_DIR) -> Path:
    """The log store's jar for the current source, compiled first if missing."""
    jar = jar_path(jars_dir)
    if jar.is_file():
        return jar
    jars_dir.mkdir(parents=True, exist_ok=True)
    with open(jars_dir / f".{JAR_PREFIX}lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time (parallel test workers, two datacenters)
        if not jar.is_file():
            _build(jar, jars_dir)
    return jar


def _build(jar: Path, jars_dir: Path) -> None:
    javac = shutil.which("javac")
    if javac is None:
        raise RuntimeError("javac not found: Photon compiles its Delta log store with a JDK 17 (see README, setup)")
    class_path = [jars_dir / DELTA_STORAGE_JAR, *(Path(_find_spark_home()) / "jars").glob("hadoop-client-api-*.jar")]
    if len(class_path) != 2 or not class_path[0].is_file():
        raise RuntimeError(f"Delta's storage jar or Hadoop's client API missing ({class_path}): run scripts/setup.sh first")
    with tempfile.TemporaryDirectory(dir=jars_dir) as build:
        compiled = subprocess.run(
            [javac, "--release", "17", "-nowarn", "-d", build, "-cp", ":".join(map(str, class_path)), str(SOURCE)],
            capture_output=True, text=True)
        if compiled.returncode != 0:
            raise RuntimeError(f"compiling {SOURCE.name} failed: {compiled.stderr.strip()}")
        partial = Path(build) / jar.name
        with zipfile.ZipFile(partial, "w") as archive:
            archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
            for path in sorted(Path(build).rglob("*.class")):
                archive.write(path, path.relative_to(build).as_posix())
        partial.replace(jar)  # whole or not at all, for a session starting meanwhile
    for stale in jars_dir.glob(f"{JAR_PREFIX}*.jar"):
        if stale != jar:
            stale.unlink(missing_ok=True)


if __name__ == "__main__":  # scripts/setup.sh
    print(f"Delta log store: {log_store_jar()}", file=sys.stderr)
