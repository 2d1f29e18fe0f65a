"""Photon's no-join floor (issue 73), as far as it can be built outside the product: the live logs read
and appended to Delta tables by Photon's own engine, with no join, no registry, no Dagster run.

A loop on Photon's local Spark session (resources/spark/session.py: `delta_session`, so its JVM options,
collector and class archive), back to back as a default trigger: each pass lists both streams' complete
lines appended since the last (the product's listing, resources/state/work_unit_log.py: `new_ranges`),
parses them with the product's parser (spark_ops/parse.py: `parse_in_driver`, the function a click
unit's lines go through), and appends the valid click rows to `<data>/floor/clicks` and the valid query
rows to `<data>/floor/queries` (Delta, one commit each). A click's latency is read from the click
table's Delta log as for `joined_clicks`. It stops once the generator has written its summary and a
pass found nothing new.

What it leaves out of Photon's input path: the dispatcher's work units and their log, Dagster's run
machinery (a run per unit, its events in the instance), the ledger, and the query tier's puts. A floor
through the same dispatcher and runs needs the product to run its click units without the join (see
benchmarks/README.md, issue 73); this one is the floor of the engine, parser and Delta commits.

    python benchmarks/photon_floor.py --data-dir DIR [--timeout-seconds 3600]

Prints one JSON object: passes, rows appended per stream, pass seconds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import pyarrow as pa  # noqa: E402

from photon.gen import SUMMARY_FILE  # noqa: E402
from resources.spark.session import delta_session  # noqa: E402
from resources.state.work_unit_log import new_ranges  # noqa: E402
from spark_ops.handoff import unstage  # noqa: E402
from spark_ops.parse import ByteRange, parse_in_driver  # noqa: E402
from spark_ops.schemas import PARSED  # noqa: E402

MAX_LINE_BYTES = 65536
STREAMS = ("query", "click")


def valid_rows(parsed: pa.Table) -> pa.Table:
    """The parsed lines that are events (no `reason`), without the parser's bookkeeping columns."""
    valid = parsed.filter(parsed.column("reason").is_null())
    return valid.drop_columns([c for c in ("reason", "snippet") if c in valid.column_names])


def run_floor(data_dir: Path, timeout_seconds: float = 3600, dc: str = "dc1") -> dict:
    spark = delta_session()
    floor = data_dir / "floor"
    shutil.rmtree(floor, ignore_errors=True)
    offsets: dict[str, dict[str, int]] = {stream: {} for stream in STREAMS}
    rows = {stream: 0 for stream in STREAMS}
    pass_seconds: list[float] = []
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        done = (data_dir / SUMMARY_FILE).exists()  # before listing: every line listed after is written
        started, found = time.monotonic(), False
        for stream in STREAMS:
            stream_dir = data_dir / "logs" / dc / stream
            ranges = [ByteRange(rel, start, end) for rel, start, end in new_ranges(stream_dir, offsets[stream])]
            if not ranges:
                continue
            found = True
            parsed = parse_in_driver(stream, stream_dir, ranges, MAX_LINE_BYTES)
            stage = floor / "stage" / f"{stream}-{len(pass_seconds)}"
            frame = unstage(spark, pa.RecordBatchReader.from_batches(parsed.schema, parsed.to_batches()), stage,
                            PARSED[stream])
            frame = frame.where("reason IS NULL").drop("reason", "snippet")
            frame.write.format("delta").mode("append").save(str(floor / ("clicks" if stream == "click" else "queries")))
            shutil.rmtree(stage, ignore_errors=True)
            rows[stream] += len(valid_rows(parsed))
            for r in ranges:
                offsets[stream][r.file] = r.end
        if found:
            pass_seconds.append(time.monotonic() - started)
        elif done:
            break
        else:
            time.sleep(0.05)
    ordered = sorted(pass_seconds)
    return {"peer": "photon_floor", "passes": len(ordered), "rows": rows,
            "pass_seconds": {"p50": round(ordered[len(ordered) // 2], 3), "max": round(ordered[-1], 3)} if ordered else None,
            "table": str(floor / "clicks")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--timeout-seconds", type=float, default=3600)
    args = parser.parse_args()
    print(json.dumps(run_floor(args.data_dir, args.timeout_seconds)), flush=True)


if __name__ == "__main__":
    main()
