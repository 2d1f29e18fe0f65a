"""The floor of a click run's writes (issue 42, item 2): what one Delta append of a few thousand rows
costs over a warm local session with the pipeline's settings, against a plain Parquet write of the
same rows and an empty Spark job, and which Delta settings move it.

    python benchmarks/append_probe.py [--rows 3000] [--appends 30]

Each variant appends `--appends` times to a fresh table with the click ledger's schema (the
project's own `append`, under its table lock), timing each append and counting its Spark jobs;
the first appends warm the session and are left out of the medians. Writes
benchmarks/results/<date>-append-probe-<commit>.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql import types as T  # noqa: E402

from benchmarks.result_file import ResultFile  # noqa: E402
from resources.spark.session import delta_session  # noqa: E402
from spark_ops.tables import TABLE_SCHEMAS, append  # noqa: E402

TABLE = "click_ledger"
WARM = 3  # appends left out of the medians
# Delta session settings tried one at a time, each on a fresh table (names as Delta 4.0 spells them).
VARIANTS = {
    "pipeline settings": {},
    "no checksum file": {"spark.databricks.delta.writeChecksumFile.enabled": "false"},
    "no file statistics": {"spark.databricks.delta.stats.collect": "false"},
    "no commit metrics": {"spark.databricks.delta.history.metricsEnabled": "false"},
}


def rows(session, n: int, batch: int):
    """`n` rows of the table's schema: ids and numbers from the row number, the rest null."""
    schema = TABLE_SCHEMAS[TABLE][0]
    base = session.range(n).withColumn("id", F.col("id") + batch * n)

    def column(field: T.StructField):
        kind = field.dataType
        if field.name == "dc":
            return F.lit("dc1").alias("dc")
        if isinstance(kind, T.StringType):
            return F.concat(F.lit(f"{field.name}-"), F.col("id").cast("string")).alias(field.name)
        if isinstance(kind, (T.LongType, T.IntegerType)):
            return F.col("id").cast(kind).alias(field.name)
        if isinstance(kind, T.TimestampType):
            return F.current_timestamp().alias(field.name)
        return F.lit(None).cast(kind).alias(field.name)

    return base.select(*[column(f) for f in schema.fields])


def timed(session, group: str, action) -> tuple[float, int]:
    """Wall seconds of `action()` and the Spark jobs it ran."""
    context = session.sparkContext
    context.setJobGroup(group, group)
    started = time.perf_counter()
    action()
    seconds = time.perf_counter() - started
    jobs = len(context.statusTracker().getJobIdsForGroup(group))
    context.setLocalProperty("spark.jobGroup.id", None)
    return seconds, jobs


def summary(samples: list[tuple[float, int]]) -> dict:
    kept = samples[WARM:]
    seconds = [s for s, _ in kept]
    return {"appends": len(kept), "median_seconds": round(statistics.median(seconds), 3),
            "p90_seconds": round(sorted(seconds)[int(0.9 * (len(seconds) - 1))], 3),
            "max_seconds": round(max(seconds), 3), "median_spark_jobs": statistics.median(j for _, j in kept),
            "seconds": [round(s, 3) for s, _ in samples]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--appends", type=int, default=30)
    args = parser.parse_args()
    results = ResultFile("append-probe")
    session = delta_session()
    work = Path(tempfile.mkdtemp(prefix="append-probe-"))
    out: dict = {"workload": {"rows_per_append": args.rows, "appends": args.appends, "table": TABLE}}
    floors = {"empty job": [], "parquet write": []}
    for i in range(args.appends):
        floors["empty job"].append(timed(session, f"empty-{i}", lambda: session.range(1).count()))
        floors["parquet write"].append(timed(session, f"parquet-{i}", lambda i=i: rows(session, args.rows, i).write.parquet(
            str(work / "parquet" / str(i)))))
    out["floors"] = {name: summary(samples) for name, samples in floors.items()}
    out["delta_append"] = {}
    for name, conf in VARIANTS.items():
        for key, value in conf.items():
            session.conf.set(key, value)
        path = str(work / name.replace(" ", "_"))
        samples = [timed(session, f"{name}-{i}", lambda i=i: append(rows(session, args.rows, i), TABLE, path))
                   for i in range(args.appends)]
        out["delta_append"][name] = {"settings": conf, **summary(samples)}
        for key in conf:
            session.conf.unset(key)
        print(name, out["delta_append"][name]["median_seconds"], "s,", out["delta_append"][name]["median_spark_jobs"],
              "jobs", file=sys.stderr)
    print(f"written to {results.write(out)}")


if __name__ == "__main__":
    main()
