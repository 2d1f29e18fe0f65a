"""Where a warm pass spends its time (issue 21): the per-phase medians of every run of a live
`photon run` (in process, one local[2] session), from the metadata each run records.

`photon gen --follow` appends at `--rate` clicks/s (and ten times as many queries) for `--duration-s`
while `photon run --until-idle --min-seconds` tails the logs. For each kind of run (query ingest,
click join, aggregates refresh): runs, median seconds by phase (the join's own steps under
`join_*`), Spark jobs and Delta commits, and rows per run.

Writes benchmarks/results/<date>-pass_phases-<commit>.json and prints one line per kind of run.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import dagster as dg

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.result_file import ResultFile  # noqa: E402

KINDS = {"query": "query_logs", "click": "joined_clicks", "aggregates": "click_aggregates"}
COUNTS = ("spark_jobs", "delta_commits", "queries_added", "clicks_looked_up", "clicks_joined")


def medians(data_dir: Path) -> dict:
    from photon.deployment import headless_instance
    from resources.state.layout import DataLayout

    instance = headless_instance(DataLayout(data_dir))
    out = {}
    for kind, asset in KINDS.items():
        runs = [
            {k: v.value for k, v in record.asset_materialization.metadata.items()}
            for record in instance.fetch_materializations(dg.AssetKey(asset), limit=10_000).records
        ]
        runs = [r for r in runs if "spark_jobs" in r]
        names = sorted({k for r in runs for k in r
                        if (k.startswith(("phase_", "join_")) and k.endswith("_seconds")) or k in COUNTS})
        out[kind] = {"runs": len(runs), **{
            name: round(statistics.median([r[name] for r in runs if isinstance(r.get(name), (int, float))]), 3)
            for name in names if any(isinstance(r.get(name), (int, float)) for r in runs)
        }}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--duration-s", type=float, default=150.0)
    args = parser.parse_args()
    results = ResultFile("pass_phases")
    data = args.work_dir / "pass_phases"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    photon = [sys.executable, "-m", "photon.cli"]
    gen = subprocess.Popen([*photon, "gen", "--data-dir", str(data), "--follow", "--rate", str(args.rate),
                            "--duration-s", str(args.duration_s)], cwd=REPO, stdout=subprocess.DEVNULL)
    try:
        run = subprocess.run([*photon, "run", "--data-dir", str(data), "--until-idle", "--json",
                              "--min-seconds", str(args.duration_s + 10)], cwd=REPO, capture_output=True, text=True)
    finally:
        gen.wait()
    if run.returncode != 0:
        raise SystemExit(f"photon run failed: {run.stderr.strip().splitlines()[-1:]}")
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    os.environ.pop("DAGSTER_HOME", None)
    result = {
        "workload": {"clicks_per_second": args.rate, "queries_per_second": args.rate * 10, "duration_s": args.duration_s},
        "verified": all(summary["verification"].values()), "wall_seconds": summary["wall_seconds"],
        "medians": medians(data),
    }
    out = results.write(result)
    for kind, row in result["medians"].items():
        print(kind, json.dumps(row))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
