"""The demo's pipeline time (issue 73, item 5): `scripts/demo.sh`'s `photon run`, on fresh directories.

`scripts/demo.sh` sets up, generates the demo workload once (`photon gen --queries 20000 --seed 42
--datacenters dc1`) and runs `photon run --until-idle --json`. What a user waits for after setup is
that run: this runs it `--repeat` times (default 3), each on a fresh data directory with the workload
generated anew (the generation is not timed), one after the other, and reports each run's wall time
(process start to exit: a cold JVM, the registry's start, every run, the verification), its clicks
joined and whether verification passed, and min / median / max. The target (issue 42): 25 s.

    python benchmarks/demo_time.py [--repeat 3] [--queries 20000] [--seed 42]

Writes benchmarks/results/<date>-demo-time-<commit>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.result_file import RESULTS, ResultFile  # noqa: E402
from benchmarks.run import Measured, generate, photon_command  # noqa: E402

TARGET_SECONDS = 25.0


def demo_run(work: Path, queries: int, seed: int) -> dict:
    """One demo: the workload generated into a fresh directory, then `photon run` timed."""
    data_dir = work / "data"
    generate(data_dir, "--queries", str(queries), "--seed", str(seed), "--datacenters", "dc1")
    measured = Measured(photon_command("run", "--data-dir", str(data_dir), "--until-idle", "--json"), work / "photon.log")
    summary = json.loads(measured.run().strip().splitlines()[-1])
    return {"wall_seconds": measured.wall_seconds, "exit_code": measured.returncode,
            "cpu_seconds": measured.cpu_seconds(), "peak_pss_bytes": measured.peak_pss_bytes,
            "clicks_joined": summary.get("clicks_joined"), "runs": summary.get("runs"),
            "verification_passed": all(summary.get("verification", {}).values())}


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
