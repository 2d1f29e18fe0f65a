"""The demo's pipeline time (issue 73, item 5): `scripts/demo.sh`'s `photon run`, on fresh directories.

`scripts/demo.sh` sets up, generates the demo workload once (`photon gen --queries 20000 --seed 42
--datacenters dc1`) and runs `photon run --until-idle --json`. What a user waits for after setup is
that run: this runs it `--repeat` times (default 3), each on a fresh data directory with the workload
generated anew (the generation is not timed), one after the other, and reports each run's wall time
(process start to exit: a cold JVM, the registry's start, every run, the verification), its clicks
joined and whether verification passed, and min / median / max. The target (issue 42): 25 s.

Where a run's time goes (`phases`, from its log's timestamps, the process's start taken here; a pass
logs the runs it launched once they are done, runs being executed in the process): to the registry
serving; to the end of the first pass that launched runs (the JVM's start, the tailers' first mirror,
the first runs); from there to the end of the last such pass (the other runs); and after it (the idle
pass, verification, the summary, the stop). With the run costs per kind from its summary
(`run_cost`: runs, median seconds, each phase's seconds in all).

    python benchmarks/demo_time.py [--repeat 3] [--queries 20000] [--seed 42]

Writes benchmarks/results/<date>-demo-time-<commit>.json.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.result_file import RESULTS, ResultFile  # noqa: E402
from benchmarks.run import Measured, generate, photon_command  # noqa: E402

TARGET_SECONDS = 25.0


STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO (.*)$")


def phases(log_text: str, started: float, wall_seconds: float) -> dict:
    """A `photon run`'s seconds from its start (`started`, epoch) to the registry serving and to the end
    of the first pass that launched runs, from there to the end of the last, and from there to the exit."""
    seen: dict[str, list[float]] = {}
    for line in log_text.splitlines():
        if match := STAMP.match(line):
            at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp() - started
            what = "registry" if match[2].startswith("local registry service") else (
                "pass" if match[2].startswith("pass launched") else None)
            if what:
                seen.setdefault(what, []).append(round(at, 2))
    passes = seen.get("pass", [])
    return {"to_registry_seconds": (seen.get("registry") or [None])[0],
            "to_first_pass_with_runs_done_seconds": passes[0] if passes else None,
            "first_to_last_pass_with_runs_seconds": round(passes[-1] - passes[0], 2) if passes else None,
            "after_last_pass_with_runs_seconds": round(wall_seconds - passes[-1], 2) if passes else None,
            "passes_with_runs": len(passes)}


def demo_run(work: Path, queries: int, seed: int) -> dict:
    """One demo: the workload generated into a fresh directory, then `photon run` timed."""
    data_dir = work / "data"
    generate(data_dir, "--queries", str(queries), "--seed", str(seed), "--datacenters", "dc1")
    started = time.time()
    measured = Measured(photon_command("run", "--data-dir", str(data_dir), "--until-idle", "--json"), work / "photon.log")
    summary = json.loads(measured.run().strip().splitlines()[-1])
    return {"wall_seconds": measured.wall_seconds, "exit_code": measured.returncode,
            "cpu_seconds": measured.cpu_seconds(), "peak_pss_bytes": measured.peak_pss_bytes,
            "clicks_joined": summary.get("clicks_joined"), "runs": summary.get("runs"),
            "verification_passed": all(summary.get("verification", {}).values()),
            "phases": phases((work / "photon.log").read_text(errors="replace"), started, measured.wall_seconds),
            "run_cost": summary.get("run_cost")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--queries", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    results = ResultFile("demo-time", results_dir=args.results_dir)
    runs = []
    for n in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="photon-demo-") as work:
            runs.append(demo_run(Path(work), args.queries, args.seed))
        print(f"run {n + 1}: {runs[-1]['wall_seconds']} s, {runs[-1]['clicks_joined']} clicks joined", flush=True)
    walls = [r["wall_seconds"] for r in runs]
    result = {"workload": {"queries": args.queries, "seed": args.seed, "command": "photon run --until-idle --json"},
              "runs": runs, "wall_seconds": {"min": min(walls), "median": statistics.median(walls), "max": max(walls)},
              "target_seconds": TARGET_SECONDS, "every_run_within_target": max(walls) <= TARGET_SECONDS}
    print(f"written to {results.write(result)}: {result['wall_seconds']}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
