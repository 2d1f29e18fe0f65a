"""The deployment's own CPU (issue 42, item 6): what each process of an idle `photon up` takes.

`photon up` on a small generated workload, driven until every joinable click is joined; then, once no
run has been under way for `--settle-s` (the work the drain leaves, a table check, the aggregates'
refresh, a compaction of its small files, is work, not idleness), the CPU time (user + system, from
/proc) each process of its tree spends over `--window-s` seconds, summed per component and given as
a share of one core, and the runs under way in the window, if any came. On two cores every idle
process counts: the target is an idle `photon up` under 10 % of a core.

    python benchmarks/idle_cpu.py [--queries 3000] [--settle-s 60] [--window-s 60]

Writes benchmarks/results/<date>-idle_cpu-<commit>.json and prints one line per component.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.result_file import ResultFile  # noqa: E402
from photon.dagster_internals import instance_at  # noqa: E402
from resources.spark.connect_server import SERVER_MARKER  # noqa: E402
from benchmarks.run import drained, generate, photon_up, process_tree_rss, stop_up  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def component(pid: int, root: int) -> str:
    """Which part of the deployment a process is, by its command line."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").replace("\0", " ")
    except OSError:
        return "gone"
    for marker, name in ((SERVER_MARKER, "spark connect server (JVM)"), ("connect_driver", "spark connect driver (python)"),
                         ("worker_daemon", "python workers"), ("pyspark.daemon", "python workers"), ("event-store tail", "query tailer"),
                         ("registry serve", "registry service"), ("dagster-daemon", "dagster-daemon"),
                         ("dagster-webserver", "dagster-webserver"), ("api grpc", "code server"),
                         ("execute_run", "run process"), ("api execute", "run process")):
        if marker in command:
            return name
    return "photon up" if pid == root else command.split(" ")[0].rsplit("/", 1)[-1]


def cpu_seconds(pid: int) -> tuple[float, float, int] | None:
    """CPU seconds of the process itself, of the children it has waited for (the kernel adds a child's
    time to its parent's when the parent reaps it), and its parent's pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICKS, (int(fields[13]) + int(fields[14])) / TICKS, int(fields[1])


def measure(root: int, window_s: float) -> dict:
    """Per component: processes and the share of one core they used over the window. A process that
    exits within the window counts in its parent's component, through the time its parent took over
    by reaping it, less what it had used before the window. A parent that ignores SIGCHLD takes
    nothing over: what such a child used in the window is not counted."""
    before = {pid: cpu_seconds(pid) for pid in process_tree_rss(root)}
    started = time.monotonic()
    time.sleep(window_s)
    elapsed = time.monotonic() - started
    now = {pid: cpu_seconds(pid) for pid in process_tree_rss(root)}
    gone: dict[int, float] = {}  # parent -> time its children that exited had used before the window
    for pid, then in before.items():
        if then is not None and now.get(pid) is None:
            gone[then[2]] = gone.get(then[2], 0.0) + then[0] + then[1]
    by_component: dict[str, dict] = {}
    for pid, current in now.items():
        if current is None:
            continue
        own, reaped, _ = current
        then = before.get(pid)  # a process born in the window counts from zero
        own_used = own - (then[0] if then else 0.0)
        reaped_used = reaped - (then[1] if then else 0.0)
        used = own_used + reaped_used - min(gone.get(pid, 0.0), reaped_used)
        row = by_component.setdefault(component(pid, root), {"processes": 0, "core_share": 0.0})
        row["processes"] += 1
        row["core_share"] += used / elapsed
    for row in by_component.values():
        row["core_share"] = round(row["core_share"], 4)
    return by_component


def quiet_for(instance) -> float:
    """Seconds since the deployment's last run ended (0: one is queued or under way)."""
    import dagster as dg

    from photon_assets.work_unit import UNFINISHED

    if instance.get_runs_count(dg.RunsFilter(statuses=[*UNFINISHED])):
        return 0.0
    ended = [record.end_time for record in instance.get_run_records(limit=20) if record.end_time]
    return time.time() - max(ended, default=0.0)


def runs_in_window(instance, start: float, end: float) -> list[dict]:
    """The deployment's runs that were under way in the window, by job: their CPU is in the window's
    count too (a check, refresh or maintenance run after the drain is work, not idleness)."""
    import dagster as dg

    rows = []
    for record in instance.get_run_records(dg.RunsFilter(updated_after=datetime.fromtimestamp(start, UTC))):
        began, ended = record.start_time, record.end_time or end
        if began is not None and began < end and ended > start:
            rows.append({"job": record.dagster_run.job_name, "start_s": round(began - start, 1),
                         "seconds": round(ended - began, 1)})
    return sorted(rows, key=lambda row: row["start_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=3000)
    parser.add_argument("--settle-s", type=float, default=60.0)
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--results-dir", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    results = ResultFile("idle_cpu", results_dir=args.results_dir)
    with tempfile.TemporaryDirectory() as work:
        data_dir = Path(work) / "data"
        truth = generate(data_dir, "--queries", str(args.queries), "--seed", "42", "--datacenters", "dc1")
        up = photon_up(data_dir, Path(work))
        try:
            deadline = time.monotonic() + 900
            while not drained(data_dir, truth["joinable_clicks"]):
                if time.monotonic() > deadline or up.process.poll() is not None:
                    raise SystemExit("photon up did not drain the workload")
                time.sleep(2)
            instance = instance_at(data_dir / "dagster")
            while quiet_for(instance) < args.settle_s:
                if time.monotonic() > deadline:
                    raise SystemExit(f"photon up never went {args.settle_s} s without a run")
                time.sleep(2)
            window_start = time.time()
            components = measure(up.process.pid, args.window_s)
            runs = runs_in_window(instance, window_start, time.time())
        finally:
            stop_up(up)
    total = round(sum(row["core_share"] for row in components.values()), 4)
    result = {"workload": {"queries": args.queries}, "settle_seconds": args.settle_s, "window_seconds": args.window_s,
              "idle_core_share": total, "runs_in_window": runs,
              "components": dict(sorted(components.items(), key=lambda kv: -kv[1]["core_share"]))}
    out = results.write(result)
    for name, row in result["components"].items():
        print(f"{name:32s} {row['processes']:3d} process(es) {100 * row['core_share']:6.1f} % of a core")
    for run in runs:
        print(f"run in the window: {run['job']} from +{run['start_s']} s for {run['seconds']} s")
    print(f"idle photon up: {100 * total:.1f} % of a core; written to {out}")


if __name__ == "__main__":
    main()
