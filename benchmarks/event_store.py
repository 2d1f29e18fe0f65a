"""EventStore benchmark (issue 4): the cache tier against the logs tier, and retries of late queries.

1. The demo workload (`photon gen --queries N --seed S`) joined twice from scratch: once with a cache
   retention longer than the workload (cache only), once with a retention of 70% of its event-time
   span, so that 30% of queries are older than the cache when their clicks are joined.
   Reported: lookups served by each tier, hit ratio, logs-tier bytes read per lookup, wall time and
   joined clicks per second.
2. The same workload with the late writer's query logs withheld, joined, then the late logs
   written and joined again. Reported: lookups made by pending retries per click they joined.

Writes benchmarks/results/<date>-event_store-<commit>.json and prints a markdown table.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import dagster as dg

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.result_file import ResultFile  # noqa: E402
SPAN_SECONDS = 3600.0  # photon gen's default event-time span of the queries


def photon(*args: str, settings: dict | None = None) -> dict:
    env = {**os.environ, "PHOTON_SETTINGS": json.dumps(settings or {})}
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "photon.cli", *args], cwd=REPO, env=env, capture_output=True, text=True)
    if out.returncode not in (0, 1):
        raise SystemExit(f"photon {' '.join(args)} failed: {out.stderr.strip().splitlines()[-1:]}")
    if args[0] != "run":
        return {}
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    summary["process_seconds"] = round(time.monotonic() - started, 2)
    return summary


def pending_retry_lookups(data_dir: Path) -> tuple[int, int]:
    """(clicks looked up by pending retries, clicks those retries joined), from run metadata."""
    os.environ["DAGSTER_HOME"] = str(data_dir / "dagster")
    looked = joined = 0
    with dg.DagsterInstance.get() as instance:
        result = instance.fetch_materializations(dg.AssetKey("joined_clicks"), limit=10000)
        for record in result.records:
            meta = record.asset_materialization.metadata
            if meta.get("kind") and meta["kind"].value == "pending":
                looked += meta["clicks_looked_up"].value
                joined += meta["clicks_joined"].value
    return looked, joined


def tier_row(name: str, summary: dict) -> dict:
    store = summary["event_store"]
    return {
        "run": name,
        "wall_seconds": summary["wall_seconds"],
        "clicks_joined": summary["clicks_joined"],
        "joined_per_second": round(summary["clicks_joined"] / summary["wall_seconds"], 1),
        "cache_hits": store["cache_hits"],
        "logs_hits": store["logs_hits"],
        "not_found": store["not_found"],
        "cache_hit_ratio": store["cache_hit_ratio"],
        "logs_bytes_read": store["logs_bytes_read"],
        "logs_bytes_per_logs_lookup": store["logs_bytes_per_lookup"],
        "checks_passed": all(summary["verification"].values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    results = ResultFile("event_store")
    work = Path(tempfile.mkdtemp(prefix="photon-bench-es-"))
    gen = ["--queries", str(args.queries), "--seed", str(args.seed)]
    rows = []
    try:
        for name, retention in (("cache only", 10 * SPAN_SECONDS), ("30% older than the cache", 0.7 * SPAN_SECONDS)):
            data = work / name.split()[0]
            photon("gen", "--data-dir", str(data), *gen)
            rows.append(tier_row(name, photon("run", "--data-dir", str(data), "--until-idle", "--json",
                                              settings={"query_cache_retention_seconds": retention})))
        late = work / "late"
        photon("gen", "--data-dir", str(late), *gen, "--withhold-late")
        first = photon("run", "--data-dir", str(late), "--until-idle", "--json")
        photon("gen", "--data-dir", str(late), *gen, "--only-late")
        second = photon("run", "--data-dir", str(late), "--until-idle", "--json")
        looked, joined = pending_retry_lookups(late)
        retries = {
            "pending_after_first_run": first["clicks_pending"],
            "pending_after_late_logs": second["clicks_pending"],
            "joined_by_pending_retries": joined,
            "lookups_by_pending_retries": looked,
            "retry_lookups_per_joined_click": round(looked / joined, 2) if joined else None,
            "runs_second_pass": second["runs"],
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"workload": {"queries": args.queries, "seed": args.seed},
              "tiers": rows, "late_queries": retries}
    out = results.write(result)
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")
    print(json.dumps(retries, indent=2))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
