"""Parse probe (issue 21): is parsing query lines in the JVM worth a second parser?

On the same query logs (`photon gen --queries N`), warm, in one local[2] session:
1. pipeline: the pipeline's parse (spark_ops/parse.py: the Python parser in executors, msgspec), staged
   as Parquet and counted as a query pass does (`stage_lines`, `line_stats`);
2. jvm_read: Spark's text reader counting the lines and their bytes, the JVM's floor;
3. jvm_contract: the same lines through `from_json` with the contract's schema plus the tests that
   would let the JVM accept a line only where the Python parser gives the same event: the lines'
   keys and extra fields (a second parse, as a one-element array, so that trailing text fails),
   a regular expression proving that every field the contract types as a string is a JSON string
   (`from_json` reads `"ad_id": 5` as "5"), the id form, and the extra fields written back as JSON.
   Offsets, the size limit and invalid UTF-8 are left out, so this is a lower bound of that path.

Writes benchmarks/results/<date>-parse_probe-<commit>.json and prints one line per path.
"""

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pyspark.sql import functions as F
from pyspark.sql import types as T

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.result_file import ResultFile  # noqa: E402
from resources.spark.session import delta_session  # noqa: E402
from spark_ops.events import QUERY_REQUIRED  # noqa: E402
from spark_ops.ingest import line_stats, stage_lines  # noqa: E402
from spark_ops.parse import ByteRange  # noqa: E402
from spark_ops.schemas import AD  # noqa: E402

EVENT_ID = r"^([0-9A-Fa-f.:\[\]]+?):([0-9]+):([0-9]+)$"
# A key other than the integer and array fields, followed by a value that is not a string.
NOT_A_STRING = r'"(?!(?:timestamp_us|ads|position|bid_micros)")[^"]*"\s*:\s*[^"\s]'
OPTIONS = {"allowSingleQuotes": "false", "allowNonNumericNumbers": "false"}
QUERY = T.StructType([T.StructField("query_id", T.StringType()), T.StructField("timestamp_us", T.LongType()),
                      T.StructField("query_text", T.StringType()), T.StructField("ads", T.ArrayType(AD))])


def pipeline(spark, query_dir: Path) -> int:
    ranges = [ByteRange(str(p.relative_to(query_dir)), 0, p.stat().st_size) for p in sorted(query_dir.rglob("*.jsonl"))]
    staged = query_dir.parent.parent.parent / "staging" / "parse_probe"
    stage_lines(spark, "query", query_dir, ranges, 65536, staged)
    return line_stats(staged, by_writer=True).events


def jvm_read(spark, query_dir: Path) -> int:
    return spark.read.text(str(query_dir / "*" / "*.jsonl")).agg(F.count("*"), F.sum(F.length("value"))).first()[0]


def jvm_contract(spark, query_dir: Path) -> int:
    text = F.col("value")
    event = F.from_json(text, QUERY, OPTIONS)
    whole = F.from_json(F.concat(F.lit("["), text, F.lit("]")), T.ArrayType(T.MapType(T.StringType(), T.StringType())), OPTIONS)
    fields = whole[0]
    keys = F.map_keys(fields)
    extra = F.map_filter(fields, lambda k, v: ~k.isin(*QUERY_REQUIRED))
    accepted = (
        text.startswith("{") & ~text.contains("\\") & (F.size(whole) == 1)
        & (F.size(keys) == F.size(F.array_distinct(keys)))
        & event["query_id"].isNotNull() & event["timestamp_us"].isNotNull() & event["query_text"].isNotNull()
        & F.forall(event["ads"], lambda ad: ad.isNotNull() & ad["ad_id"].isNotNull() & ad["advertiser_id"].isNotNull()
                   & ad["position"].isNotNull() & ad["bid_micros"].isNotNull())
        & ~text.rlike(NOT_A_STRING) & event["query_id"].rlike(EVENT_ID)
    )
    rows = spark.read.text(str(query_dir / "*" / "*.jsonl")).select(
        F.coalesce(accepted, F.lit(False)).alias("accepted"),
        F.when(F.size(extra) > 0, F.to_json(extra)).alias("extra"),
        F.regexp_extract(event["query_id"], EVENT_ID, 1).alias("server_ip"),
        F.size(event["ads"]).alias("ads"),
    )
    return rows.agg(F.count_if("accepted"), F.max("extra"), F.max("server_ip"), F.sum("ads")).first()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    results = ResultFile("parse_probe")
    data = args.work_dir / "parse_probe"
    if not (data / "gen_summary.json").exists():
        subprocess.run([sys.executable, "-m", "photon.cli", "gen", "--data-dir", str(data), "--queries",
                        str(args.queries), "--seed", "1", "--datacenters", "dc1"], cwd=REPO, check=True,
                       capture_output=True)
    query_dir = data / "logs" / "dc1" / "query"
    megabytes = sum(p.stat().st_size for p in query_dir.rglob("*.jsonl")) / 1e6
    spark = delta_session()
    paths = {}
    for name, probe in (("pipeline", pipeline), ("jvm_read", jvm_read), ("jvm_contract", jvm_contract)):
        probe(spark, query_dir)  # warm-up: JIT, Python workers
        seconds, lines = [], None
        for _ in range(args.runs):
            started = time.monotonic()
            lines = probe(spark, query_dir)
            seconds.append(round(time.monotonic() - started, 3))
        median = statistics.median(seconds)
        paths[name] = {"seconds": seconds, "median_seconds": median, "lines": lines,
                       "megabytes_per_second": round(megabytes / median, 1)}
        print(f"{name}: {median:.2f} s, {megabytes / median:.1f} MB/s ({lines} lines)", flush=True)
    result = {"workload": {"queries": args.queries, "megabytes": round(megabytes, 1)}, "paths": paths}
    out = results.write(result)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
