"""Two datacenters, one registry (issue 5): wasted joins and catch-up after an outage.

1. Both at once: the default two-datacenter workload (`photon gen --datacenters dc1,dc2`), one
   registry server, and one `photon run` per datacenter started together, as two datacenters'
   pipelines would be. Reported per datacenter: clicks looked up, skipped at the dispatcher lookup
   (registered by the other), joined, and wasted joins (joined, then refused by the registry);
   the wasted share is Photon's "events processed by both joiners" (under 5% in the paper).
2. Outage and catch-up (Photon Figure 13): the same workload with replication to dc2 stopped
   (`--replication-lag dc2=inf`); dc1 processes the whole backlog alone; replication resumes
   (`photon replicate --to dc2`) and dc2 catches up through the same backlog, mostly skipping ids
   dc1 registered. Reported: dc2's catch-up time over the time dc1 took for the backlog.

Writes benchmarks/results/<date>-datacenters.json and prints a summary.
"""

import argparse
import datetime
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PHOTON = [sys.executable, "-m", "photon.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(*args: str) -> None:
    out = subprocess.run([*PHOTON, *args], cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"photon {' '.join(args)} failed: {out.stderr.strip()[-500:]}")


def start_run(data_dir: Path, dc: str, address: str) -> tuple[subprocess.Popen, float]:
    env = {**os.environ, "PHOTON_REGISTRY_ADDRESS": address}
    process = subprocess.Popen([*PHOTON, "run", "--data-dir", str(data_dir), "--until-idle", "--json",
                                "--datacenters", dc], cwd=REPO, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    return process, time.monotonic()


def finish(process: subprocess.Popen, started: float) -> dict:
    out, err = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"photon run failed: {err.strip()[-800:]}")
    summary = json.loads(out.strip().splitlines()[-1])
    summary["process_seconds"] = round(time.monotonic() - started, 2)
    return summary


class Registry:
    def __init__(self, data_dir: Path):
        ready = data_dir / "registry.ready"
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        self.log = open(data_dir / "registry-bench.log", "ab")
        self.process = subprocess.Popen([*PHOTON, "registry", "serve", "--data-dir", str(data_dir), "--port", str(port),
                                         "--ready-file", str(ready)], cwd=REPO, stdout=self.log, stderr=self.log)
        while not ready.exists():
            if self.process.poll() is not None:
                raise SystemExit("the registry server did not start")
            time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait()
        self.log.close()


def dc_row(summary: dict, dc: str) -> dict:
    joiner = summary["joiner_by_dc"][dc]
    return {
        "dc": dc,
        "wall_seconds": summary["wall_seconds"],
        "runs": summary["runs"],
        "clicks_looked_up": joiner["clicks"],
        "skipped_registered": joiner["skipped_registered"],
        "joined": joiner["joined"],
        "wasted_joins": joiner["refused"],
        "checks_passed": all(summary["verification"].values()),
    }


def both_at_once(work: Path, gen: list[str]) -> dict:
    data = work / "both"
    command("gen", "--data-dir", str(data), *gen)
    registry = Registry(data)
    try:
        runs = [start_run(data, dc, registry.address) for dc in ("dc1", "dc2")]
        rows = [dc_row(finish(*run), dc) for run, dc in zip(runs, ("dc1", "dc2"))]
    finally:
        registry.stop()
    joined = sum(r["joined"] for r in rows)
    wasted = sum(r["wasted_joins"] for r in rows)
    return {"datacenters": rows, "joined_total": joined, "wasted_joins_total": wasted,
            "wasted_join_share": round(wasted / (joined + wasted), 4) if joined + wasted else None}


def outage_and_catch_up(work: Path, gen: list[str]) -> dict:
    data = work / "outage"
    command("gen", "--data-dir", str(data), *gen, "--replication-lag", "dc2=inf")
    registry = Registry(data)
    try:
        first = dc_row(finish(*start_run(data, "dc1", registry.address)), "dc1")
        command("replicate", "--data-dir", str(data), "--to", "dc2")
        catch_up = dc_row(finish(*start_run(data, "dc2", registry.address)), "dc2")
    finally:
        registry.stop()
    return {
        "backlog_first_time": first,
        "catch_up": catch_up,
        "catch_up_ratio": round(catch_up["wall_seconds"] / first["wall_seconds"], 3),
        "catch_up_skipped_share": round(catch_up["skipped_registered"] / catch_up["clicks_looked_up"], 4)
        if catch_up["clicks_looked_up"] else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    gen = ["--queries", str(args.queries), "--seed", str(args.seed), "--datacenters", "dc1,dc2"]
    work = Path(tempfile.mkdtemp(prefix="photon-bench-dc-"))
    try:
        result = {
            "date": datetime.date.today().isoformat(),
            "workload": {"queries": args.queries, "seed": args.seed, "datacenters": ["dc1", "dc2"]},
            "both_at_once": both_at_once(work, gen),
            "outage": outage_and_catch_up(work, gen),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = REPO / "benchmarks" / "results" / f"{result['date']}-datacenters.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
