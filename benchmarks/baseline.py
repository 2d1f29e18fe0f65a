"""Baseline of the foundation: the demo workload through `photon run --until-idle`.

Generates the workload into a fresh directory, runs the pipeline, and reads from the Dagster
instance how long runs took and where a micro-batch spends its time. Writes
benchmarks/results/<date>-baseline-<commit>.json and prints a Markdown table.

    .venv/bin/python benchmarks/baseline.py [--queries 20000] [--keep DIR]
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.result_file import ResultFile  # noqa: E402


def photon(*args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "photon.cli", *args], cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"photon {args[0]} failed: {result.stderr.strip().splitlines()[-1:]}")
    return result.stdout


def run_phases(data_dir: Path) -> dict:
    """Per job: runs, mean seconds from run creation to start and from start to end, and the mean
    of each phase the join records in its materialization metadata."""
    import dagster as dg
    from photon.dagster_internals import instance_at

    instance = instance_at(data_dir / "dagster")
    jobs: dict[str, dict] = {}
    for record in instance.get_run_records(dg.RunsFilter(statuses=[dg.DagsterRunStatus.SUCCESS])):
        run = record.dagster_run
        job = jobs.setdefault(run.job_name, {"runs": 0, "start": [], "execution": []})
        job["runs"] += 1
        job["start"].append(record.start_time - record.create_timestamp.timestamp())
        job["execution"].append(record.end_time - record.start_time)
    phases: dict[str, list[float]] = {}
    for event in instance.fetch_materializations(dg.AssetKey("joined_clicks"), limit=10_000).records:
        metadata = event.asset_materialization.metadata
        for key, value in metadata.items():
            # A click run that joined nothing records its join delays as None.
            if key.startswith(("phase_", "join_")) and key.endswith("_seconds") and value.value is not None:
                phases.setdefault(key[: -len("_seconds")], []).append(value.value)
    return {
        "jobs": {
            name: {
                "runs": j["runs"],
                "mean_run_start_seconds": round(statistics.mean(j["start"]), 3),
                "mean_run_seconds": round(statistics.mean(j["execution"]), 3),
            }
            for name, j in jobs.items()
        },
        "join_phase_mean_seconds": {k: round(statistics.mean(v), 3) for k, v in phases.items()},
    }


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--queries", type=int, default=20000)
    options.add_argument("--seed", type=int, default=42)
    options.add_argument("--keep", type=Path, help="use (and keep) this data directory")
    args = options.parse_args()
    results = ResultFile("baseline")

    data_dir = args.keep or Path(tempfile.mkdtemp(prefix="photon-bench-"))
    photon("gen", "--data-dir", str(data_dir), "--queries", str(args.queries), "--seed", str(args.seed))
    truth = json.loads((data_dir / "gen_summary.json").read_text())
    input_bytes = sum(p.stat().st_size for p in (data_dir / "logs").rglob("*.jsonl"))
    started = time.monotonic()
    summary = json.loads(photon("run", "--data-dir", str(data_dir), "--until-idle", "--json").strip().splitlines()[-1])
    wall = time.monotonic() - started
    result = {
        "workload": {"queries": truth["query_events"], "click_lines": truth["click_lines"],
                     "input_events": truth["query_events"] + truth["click_lines"], "input_bytes": input_bytes},
        "photon_run": summary,
        "process_wall_seconds": round(wall, 2),
        "joined_clicks_per_second": round(summary["clicks_joined"] / wall, 1),
        **run_phases(data_dir),
    }
    out = results.write(result)
    print(json.dumps(result, indent=2, sort_keys=True))
    print(f"written to {out}")
    if not args.keep:
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
