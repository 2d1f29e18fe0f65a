#!/usr/bin/env bash
# Sets up everything the project needs, idempotently: the .venv with the pinned packages and the
# project itself, and Delta Lake's JVM jars fetched once from Maven Central into .cache/jars
# (git-ignored), from where every Spark session loads them, and the JVM class archive made from them
# (.cache/jvm); Apache Flink's own .venv-flink and jars
# for the benchmark's Flink peer; and Debian's chromium for the browser test (tests/e2e/test_ui.py;
# Playwright's own browser download is not reachable here) and etcd for the replicated registry.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "setup: $*" >&2; exit 1; }

python=""
for candidate in python3.11 python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    python=$candidate; break
  fi
done
[ -n "$python" ] || die "Python 3.11 is required"
command -v java >/dev/null || die "Java 17 is required (java not found)"
java -version 2>&1 | grep -q 'version "17' || die "Java 17 is required, found: $(java -version 2>&1 | head -1)"

[ -x .venv/bin/python ] || "$python" -m venv .venv
stamp=.venv/.photon-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[test,bench]"
  touch "$stamp"
fi

if ! ls .cache/jars/delta-spark_2.13-*.jar .cache/jars/delta-storage-*.jar >/dev/null 2>&1; then
  command -v mvn >/dev/null || die "Maven is required once, to fetch the Delta jars"
  mvn --batch-mode --quiet -f scripts/jars-pom.xml -Dmaven.repo.local="$PWD/.cache/m2" \
    dependency:copy-dependencies -DoutputDirectory="$PWD/.cache/jars"
fi

# Delta's log store for this project's tables (resources/spark/log_store.py) and the plugin that runs the
# Spark tasks off the click path at a lower priority (resources/spark/task_priority.py): one Java class each,
# compiled with the JDK's javac against the jars above, in ~2 s, once per version of its source (before
# the class archive, which is named after the jars).
.venv/bin/python -m resources.spark.log_store
.venv/bin/python -m resources.spark.task_priority

# The JVM class archive (resources/spark/class_archive.py): Spark's, Delta's and Connect's classes laid out
# once, so each JVM of the pipeline maps them instead of loading them from the jars (~6 s off a cold
# start). Made by a training run over the demo workload, ~70 s, once per Java, pyspark and Delta version;
# without it (the line says why) everything runs the same, slower to start.
.venv/bin/python -m photon.make_class_archive || true

# Apache Flink for the benchmark's Flink peer (benchmarks/flink_join.py, run by benchmarks/peers.py):
# PyFlink pins pyarrow, pandas, py4j and apache-beam to versions the .venv cannot share, so it has a
# virtual environment of its own, .venv-flink, with every package pinned in
# benchmarks/flink-requirements.txt; and the jars of benchmarks/flink-jars-pom.xml (Flink's Parquet
# format, Hadoop's client) fetched once from Maven Central into .cache/flink-jars.
[ -x .venv-flink/bin/python ] || "$python" -m venv .venv-flink
[ -f .venv-flink/.gitignore ] || echo '*' > .venv-flink/.gitignore  # git ignores .venv/ and .cache/ only
flink_stamp=.venv-flink/.flink-installed
if [ ! -f "$flink_stamp" ] || [ benchmarks/flink-requirements.txt -nt "$flink_stamp" ]; then
  .venv-flink/bin/python -m pip install --quiet --upgrade pip
  .venv-flink/bin/python -m pip install --quiet -r benchmarks/flink-requirements.txt
  touch "$flink_stamp"
fi
flink_jars_stamp=.cache/flink-jars/.fetched
if [ ! -f "$flink_jars_stamp" ] || [ benchmarks/flink-jars-pom.xml -nt "$flink_jars_stamp" ]; then
  command -v mvn >/dev/null || die "Maven is required once, to fetch Flink's Parquet and Hadoop jars"
  rm -rf .cache/flink-jars
  mvn --batch-mode --quiet -f benchmarks/flink-jars-pom.xml -Dmaven.repo.local="$PWD/.cache/m2" \
    dependency:copy-dependencies -DoutputDirectory="$PWD/.cache/flink-jars"
  touch "$flink_jars_stamp"
fi

# Debian's packages: chromium, for tests/e2e/test_ui.py; etcd-server and etcd-client, the replicated
# registry's log (photon/registry_cluster.py starts its members; etcdctl for the tests). Installed when
# missing and running as root (CI), else one line saying what to install.
missing=""
[ -x /usr/bin/chromium ] || missing="$missing chromium"
[ -x /usr/bin/etcd ] || missing="$missing etcd-server"
[ -x /usr/bin/etcdctl ] || missing="$missing etcd-client"
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
  else
    echo "setup: needs Debian's$missing: sudo apt-get install$missing" >&2
  fi
fi
