"""From `photon up` to the first joined click, and where the time goes (issue 43).

`photon up` started on a freshly generated small workload (one datacenter): the seconds from its start
to each milestone, polled every 0.2 s or read from the deployment's own records: the Spark Connect
server serving (photon up's log), the UI serving (its ready line), the first run created, the first
query and click runs' start and end, the first joined click committed, every joinable click joined and
no run unfinished; then SIGTERM, and how long the stop took. The target: the first joined click within
30 s of the start on 3,000 queries.

    python benchmarks/up_start.py [--queries 3000] [--repeat 1]

Writes benchmarks/results/<date>-up-start-<commit>.json and prints one line per milestone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.result_file import ResultFile  # noqa: E402
from benchmarks.run import drained, generate, joined_rows, photon_up, stop_up  # noqa: E402

POLL_SECONDS = 0.2
TIMEOUT_SECONDS = 900


def logged_at(log: Path, marker: str) -> float | None:
    """Epoch seconds of the first line of photon up's log (its logging format: `%(asctime)s ...`) holding `marker`."""
    for line in log.read_text(errors="replace").splitlines():
        if marker in line:
            return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


def first_runs(data_dir: Path) -> tuple[dict, dict]:
    """Epoch seconds: the first run created; the first query and click runs' start and end. And those
    two runs' phases, as their materializations report them."""
    import dagster as dg

    from photon.deployment import headless_instance
    from photon_assets.jobs import INGEST_QUERIES_JOB, JOIN_CLICKS_JOB
    from resources.state.layout import DataLayout

    instance = headless_instance(DataLayout(data_dir))
    records = instance.get_run_records(dg.RunsFilter())
    found: dict = {"first_run_created": min((r.create_timestamp.timestamp() for r in records), default=None)}
    phases = {}
    for kind, job, asset in (("query", INGEST_QUERIES_JOB, "query_logs"), ("click", JOIN_CLICKS_JOB, "joined_clicks")):
        runs = sorted((r for r in records if r.dagster_run.job_name == job and r.start_time), key=lambda r: r.start_time)
        found[f"first_{kind}_run_started"] = runs[0].start_time if runs else None
        found[f"first_{kind}_run_ended"] = runs[0].end_time if runs else None
        events = instance.fetch_materializations(dg.AssetKey(asset), limit=1000, ascending=True).records
        first = next((e for e in events if runs and e.run_id == runs[0].dagster_run.run_id), None)
        if first is not None:
            metadata = {k: v.value for k, v in first.asset_materialization.metadata.items()}
            phases[kind] = {k: metadata[k] for k in sorted(metadata) if k.startswith(("phase_", "launch_to", "queued"))}
    return found, phases


def one_start(queries: int, seed: int, work: Path) -> dict:
    data_dir = work / "data"
    truth = generate(data_dir, "--queries", str(queries), "--seed", str(seed), "--datacenters", "dc1")
    table = data_dir / "warehouse" / "joined_clicks"
    started = time.time()
    up = photon_up(data_dir, work)
    at = {"ui_serving": time.time()}
    try:
        deadline = time.monotonic() + TIMEOUT_SECONDS
        while "first_joined_click" not in at or not drained(data_dir, truth["joinable_clicks"]):
            if time.monotonic() > deadline or up.process.poll() is not None:
                raise SystemExit(f"photon up did not drain the workload; see {up.log}")
            if "first_joined_click" not in at and joined_rows(table) > 0:
                at["first_joined_click"] = time.time()
            time.sleep(POLL_SECONDS)
        at["all_joined"] = time.time()
    finally:
        stopping = time.time()
        stop_up(up)
        stop_seconds = time.time() - stopping
    at["spark_connect_serving"] = logged_at(up.log, "Spark Connect server at")
    found, phases = first_runs(data_dir)
    at.update(found)
    seconds = {name: None if t is None else round(t - started, 2) for name, t in sorted(at.items(), key=lambda kv: kv[1] or 0)}
    return {"seconds_from_start": seconds, "first_runs_phases": phases, "stop_seconds": round(stop_seconds, 2),
            "joinable_clicks": truth["joinable_clicks"], "joined_rows": joined_rows(table)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--results-dir", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    results = ResultFile("up_start", "up-start", args.results_dir)
    starts = []
    for n in range(args.repeat):
        with tempfile.TemporaryDirectory() as work:
            starts.append(one_start(args.queries, args.seed + n, Path(work)))
            print(json.dumps(starts[-1]["seconds_from_start"]), flush=True)
    first = [s["seconds_from_start"]["first_joined_click"] for s in starts]
    result = {"workload": {"queries": args.queries, "datacenters": 1},
              "first_joined_click_seconds_median": statistics.median(first), "target_seconds": 30, "starts": starts}
    out = results.write(result)
    print(f"photon up to the first joined click: median {result['first_joined_click_seconds_median']} s over "
          f"{len(starts)} start(s); written to {out}")


if __name__ == "__main__":
    main()
