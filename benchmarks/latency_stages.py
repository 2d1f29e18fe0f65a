"""Where each joined click's time goes, in a live benchmark (issue 42, item 4): from its event time

1. `in_log`: to its bytes being in the click log (sampled: `LogSampler` polls the click files' sizes
   every 0.1 s while the run goes, so a click is in the log at the first sample whose size passes its
   line's offset; the generator flushes every 0.5 s);
2. `cut`: to being cut into a work unit (the dispatcher's clock when it cut the unit, in its run's
   config; a click joined by a pending-click retry counts from that retry's unit);
3. `run_start`: to the start of the run that joined it (queue and launch: ~0.1 s in `photon run`, a
   process per run under the daemon);
4. `commit`: to the commit of the first `joined_clicks` version holding it.
Each stage is reported as p50 and p90 of its own duration over the joined clicks, with the end to
end latency beside it, so a missed target names its stage.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np


class LogSampler:
    """The sizes of the click files under `click_dir`, polled on a thread every `every_seconds`: per
    file, (time, size) at each change."""

    def __init__(self, click_dir: Path, every_seconds: float = 0.1):
        self.click_dir, self.every_seconds = click_dir, every_seconds
        self.samples: dict[str, list[tuple[float, int]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-sampler", daemon=True)

    def __enter__(self) -> "LogSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        from resources.state.work_unit_log import log_files  # the pipeline's own listing: the cheapest here

        while not self._stop.is_set():
            now = time.time()
            for _, rel, _, size in log_files(self.click_dir):
                seen = self.samples.setdefault(rel, [])
                if not seen or seen[-1][1] != size:
                    seen.append((now, size))
            self._stop.wait(self.every_seconds)

    def in_log_at(self, file: str, offset: int) -> float | None:
        """The first sampled time at which `file` held the byte at `offset`."""
        for at, size in self.samples.get(file, []):
            if size > offset:
                return at
        return None


def first_commits(table: Path) -> dict[str, float]:
    """click_id -> commit time (s) of the first version of the Delta table whose added files hold it."""
    import pyarrow.parquet as pq

    first: dict[str, float] = {}
    for commit in sorted((table / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]
        committed = next(a["commitInfo"]["timestamp"] for a in actions if "commitInfo" in a) / 1e3
        for action in actions:
            if "add" in action:
                for click_id in pq.read_table(table / action["add"]["path"], columns=["click_id"]).column(
                        "click_id").to_pylist():
                    first.setdefault(click_id, committed)
    return first


def unit_runs(dagster_home: Path) -> dict[str, tuple[float, float]]:
    """work unit -> (the clock it was cut at, s; its successful run's start, s), from the instance."""
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    from photon_assets.work_unit import TAG_WORK_UNIT

    instance = dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
    found = {}
    for record in instance.get_run_records(dg.RunsFilter(statuses=[dg.DagsterRunStatus.SUCCESS])):
        run = record.dagster_run
        unit = run.tags.get(TAG_WORK_UNIT)
        config = run.run_config.get("ops", {}).get("join_clicks", {}).get("config", {})
        if unit and "clock_us" in config and record.start_time:
            found[unit] = (config["clock_us"] / 1e6, record.start_time)
    return found


def latency_stages(data_dir: Path, sampler: LogSampler, dc: str = "dc1") -> dict:
    """p50 and p90 of each stage (see the module docstring) over the clicks joined in `data_dir`."""
    from deltalake import DeltaTable

    joined = DeltaTable(str(data_dir / "warehouse" / "joined_clicks")).to_pyarrow_table(
        columns=["click_id", "timestamp_us", "work_unit"]).to_pylist()
    ledger = DeltaTable(str(data_dir / "warehouse" / "click_ledger")).to_pyarrow_table(
        columns=["click_id", "file", "offset", "dc"]).to_pylist()
    where: dict[str, tuple[str, int]] = {}
    for row in ledger:
        if row["dc"] == dc and (row["click_id"] not in where or row["offset"] < where[row["click_id"]][1]):
            where[row["click_id"]] = (row["file"], row["offset"])
    commits = first_commits(data_dir / "warehouse" / "joined_clicks")
    runs = unit_runs(data_dir / "dagster")
    stages: dict[str, list[float]] = {"in_log": [], "cut": [], "run_start": [], "commit": [], "total": []}
    for row in joined:
        event = row["timestamp_us"] / 1e6
        located = where.get(row["click_id"])
        in_log = sampler.in_log_at(*located) if located else None
        cut, started = runs.get(row["work_unit"], (None, None))
        committed = commits.get(row["click_id"])
        if None in (in_log, cut, started, committed):
            continue
        # A click cut before the sampler saw it (a 0.1 s poll) counts as in the log when cut.
        in_log = min(in_log, cut)
        for name, value in (("in_log", in_log - event), ("cut", cut - in_log), ("run_start", started - cut),
                            ("commit", committed - started), ("total", committed - event)):
            stages[name].append(value)
    return {name: ({"count": len(values), "p50": round(float(np.percentile(values, 50)), 2),
                    "p90": round(float(np.percentile(values, 90)), 2)} if values else {"count": 0})
            for name, values in stages.items()}


def _instance(dagster_home: Path):
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    return dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))


def click_runs(instance) -> list[dict]:
    """Each successful click run (one that materialized `joined_clicks`): its start and end (s) and the
    clicks it looked up."""
    import dagster as dg

    records = {r.dagster_run.run_id: r for r in instance.get_run_records(
        dg.RunsFilter(statuses=[dg.DagsterRunStatus.SUCCESS]))}
    runs = []
    for event in instance.fetch_materializations(dg.AssetKey("joined_clicks"), limit=10_000).records:
        looked_up = event.asset_materialization.metadata.get("clicks_looked_up")
        record = records.get(event.run_id)
        if looked_up is None or record is None or not record.start_time or not record.end_time:
            continue
        runs.append({"run_id": event.run_id, "start": record.start_time, "end": record.end_time,
                     "clicks": looked_up.value})
    return runs


def _fit(runs: list[dict]) -> tuple[float, float]:
    """(seconds per click, fixed seconds): the least-squares line of the runs' seconds by clicks."""
    per_click, fixed = np.polyfit(np.array([r["clicks"] for r in runs], dtype=float),
                                  np.array([r["end"] - r["start"] for r in runs]), 1)
    return float(per_click), float(fixed)


def click_run_cost(dagster_home: Path) -> dict:
    """What a click run costs, from the instance: per successful click run, the clicks it looked up
    and its seconds from start to end, and the least-squares line through them, `seconds = fixed +
    per_click * clicks`. The line is the floor of the live latency: at a click rate r a pass's cycle
    settles at D = fixed / (1 - per_click * r), and a click waits about one run for its unit to be
    cut, then its own run, so the cut and commit stages cannot sum to less than ~2 D."""
    runs = click_runs(_instance(dagster_home))
    if len(runs) < 3:
        return {"click_runs": len(runs)}
    clicks = [r["clicks"] for r in runs]
    seconds = [r["end"] - r["start"] for r in runs]
    per_click, fixed = _fit(runs)
    return {
        "click_runs": len(runs),
        "clicks_per_run": {"p50": int(np.percentile(clicks, 50)), "max": int(max(clicks))},
        "run_seconds": {"p50": round(float(np.percentile(seconds, 50)), 2), "p90": round(float(np.percentile(seconds, 90)), 2)},
        "fit_fixed_seconds": round(float(fixed), 2),
        "fit_seconds_per_1000_clicks": round(float(per_click) * 1000, 3),
    }


# The runs beside a click run that may hold it back (issue 42, item 5), by job: the work kept off the
# click path, and the query runs that build the durable tier.
BESIDE_JOBS = {"maintain_tables": "maintenance", "refresh_aggregates": "aggregates", "check_tables": "checks",
               "ingest_queries": "query"}


def upkeep_hold(dagster_home: Path) -> dict:
    """How much the runs beside a click run hold it back (issue 42, item 5: table maintenance and the
    aggregates refresh by at most a second), from the instance: see `holds`. A click run waits for no
    such run to start under either mode (a slot of its own under the daemon, a thread of its own in
    `photon run`), so the hold is what sharing the cores and the Spark session costs it."""
    instance = _instance(dagster_home)
    beside = [(BESIDE_JOBS[r.dagster_run.job_name], r.start_time, r.end_time) for r in instance.get_run_records()
              if r.dagster_run.job_name in BESIDE_JOBS and r.start_time and r.end_time]
    return holds(click_runs(instance), beside)


def holds(runs: list[dict], beside: list[tuple[str, float, float]]) -> dict:
    """The click runs (`click_runs`) that overlapped none of the `beside` runs ((kind, start, end))
    give the line of a click run's seconds by its clicks (as `click_run_cost`); a click run that
    overlapped a run of a kind counts for that kind, its hold being its seconds above that line. Per
    kind, and for the click runs alone (the line's own spread): the click runs, and their hold's p50,
    p90 and max.

    A cold start is neither: the first click run (the JVM's classes loaded, its code compiled) and a
    click run beside the first run of a kind (that run's plans compiled, its tables' logs read for the
    first time, on the same cores) count in no line; `cold_start` reports them apart (each one's
    seconds, clicks and the kinds beside it, and the longest)."""
    runs = sorted(runs, key=lambda r: r["start"])
    firsts = {}
    for kind, start, end in sorted(beside, key=lambda b: b[1]):
        firsts.setdefault(kind, (start, end))
    by_kind: dict[str, list[dict]] = {"alone": []}
    cold = []
    for i, run in enumerate(runs):
        kinds = {kind for kind, start, end in beside if start < run["end"] and end > run["start"]}
        if i == 0 or any(firsts[kind][0] < run["end"] and firsts[kind][1] > run["start"] for kind in kinds):
            cold.append({"seconds": round(run["end"] - run["start"], 2), "clicks": run["clicks"], "beside": sorted(kinds)})
            continue
        for kind in kinds or {"alone"}:
            by_kind.setdefault(kind, []).append(run)
    cold_start = {} if not cold else {"cold_start": {"click_runs": len(cold), "seconds_max": max(c["seconds"] for c in cold),
                                                     "runs": cold}}
    if len(by_kind["alone"]) < 3:
        return {"click_runs": len(runs), "alone": {"click_runs": len(by_kind["alone"])}, **cold_start}
    per_click, fixed = _fit(by_kind["alone"])
    out = {}
    for kind, kind_runs in sorted(by_kind.items()):
        held = [r["end"] - r["start"] - (fixed + per_click * r["clicks"]) for r in kind_runs]
        out[kind] = {"click_runs": len(kind_runs), "hold_p50_seconds": round(float(np.percentile(held, 50)), 2),
                     "hold_p90_seconds": round(float(np.percentile(held, 90)), 2),
                     "hold_max_seconds": round(float(max(held)), 2)}
    return {**out, **cold_start}


# Issue 73's reading of item 5: a click run beside a kind of run may take at most this much longer, at
# its worst, than the worst of the click runs alone.
HOLD_ALLOWANCE_SECONDS = 2.0


def hold_criterion(upkeep: dict) -> dict:
    """Per kind of run beside (`holds`): whether `upkeep_hold[kind].hold_max_seconds <=
    upkeep_hold.alone.hold_max_seconds + 2`, with both numbers; {} without a line of runs alone."""
    alone = upkeep.get("alone", {}).get("hold_max_seconds")
    if alone is None:
        return {}
    return {kind: {"hold_max_seconds": row["hold_max_seconds"], "alone_hold_max_seconds": alone,
                   "allowance_seconds": HOLD_ALLOWANCE_SECONDS,
                   "met": row["hold_max_seconds"] <= alone + HOLD_ALLOWANCE_SECONDS}
            for kind, row in upkeep.items() if kind != "alone" and isinstance(row, dict) and "hold_max_seconds" in row}


def main() -> None:
    """`upkeep_hold` of each Photon system of a live result whose data was kept (`run.py live
    --keep-data`; results before it had the key), written as a result of its own beside it."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("live_result", type=Path, help="a live benchmark's result file (run with --keep-data)")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.result_file import ResultFile

    live = json.loads(args.live_result.read_text())
    by_system = {system: upkeep_hold(Path(result["data_dir"]) / "live" / "dagster")
                 for system, result in live["systems"].items() if "data_dir" in result and "click_run_cost" in result}
    path = ResultFile("upkeep-hold", f"upkeep-hold-of-{args.live_result.stem}", args.live_result.parent).write(
        {"live_result": args.live_result.name, "measured_commit": live["commit"], "upkeep_hold": by_system,
         "upkeep_hold_criterion": {system: hold_criterion(hold) for system, hold in by_system.items()}})
    print(json.dumps(by_system, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
