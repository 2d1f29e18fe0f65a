"""The floor of item 5 of issue 42 (table maintenance and the aggregates refresh hold a click run back
by at most a second): how much a click run's write is held by work beside it on two cores, by what
runs beside it, over one warm local session with the pipeline's settings.

    python benchmarks/upkeep_probe.py [--rows 3000] [--appends 25] [--master local[2]]

The click-side work is the project's own `append` of `--rows` rows to a `click_ledger` table, timed
`--appends` times in each condition (the first ones warm the session and are left out):
- alone;
- beside two busy processes at the off-click-path nice value (what the kernel's priority alone
  leaves: nothing shared with the click run but the cores);
- beside an upkeep-like Spark loop in the same JVM (a Delta table read back and rewritten as Parquet,
  as a compaction does), on a thread at normal priority;
- the same loop on a lowered thread, so its jobs are tagged and, where priorities can be set back,
  its tasks run lowered (resources/spark/task_priority.py), as the pipeline runs its upkeep.
A condition's hold is each append's seconds less the median of the appends alone. `--master` sets
the session's task slots (the pipeline's `local[2]`: one per core). Writes
benchmarks/results/<date>-upkeep-probe-<commit>.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.append_probe import TABLE, WARM, rows  # noqa: E402
from benchmarks.result_file import ResultFile  # noqa: E402
from resources.spark import task_priority  # noqa: E402
from resources.runtime.priority import OFF_CLICK_PATH_NICE, lower_this_thread  # noqa: E402
from resources.spark.session import SparkResource, delta_session  # noqa: E402
from spark_ops.tables import append  # noqa: E402

UPKEEP_ROWS = 2_000_000  # the rewritten table: about the size of a compaction's input in a live run
BUSY = "while True: pass"


def timed_appends(session, n: int, rows_each: int, path: str, first_batch: int) -> list[float]:
    seconds = []
    for i in range(n):
        frame = rows(session, rows_each, first_batch + i)
        started = time.perf_counter()
        append(frame, TABLE, path)
        seconds.append(time.perf_counter() - started)
    return seconds


class UpkeepLoop:
    """Rewrites a Delta table as Parquet over and over on a thread of its own, lowered or not."""

    def __init__(self, source: str, target: Path, lowered: bool):
        self.source, self.target, self.lowered = source, target, lowered
        self.stop = threading.Event()
        self.rewrites = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        if self.lowered:
            lower_this_thread()
        session = SparkResource.local().session()  # tagged off the click path when lowered
        while not self.stop.is_set():
            session.read.format("delta").load(self.source).write.mode("overwrite").parquet(str(self.target))
            self.rewrites += 1

    def __enter__(self) -> UpkeepLoop:
        self.thread.start()
        time.sleep(3)  # into its first rewrite
        return self

    def __exit__(self, *_) -> None:
        self.stop.set()
        self.thread.join()


class BusyProcesses:
    """Two processes spinning at the off-click-path nice value."""

    def __enter__(self) -> BusyProcesses:
        self.processes = [subprocess.Popen([sys.executable, "-c", BUSY],
                                           preexec_fn=lambda: os.nice(OFF_CLICK_PATH_NICE)) for _ in range(2)]
        time.sleep(1)
        return self

    def __exit__(self, *_) -> None:
        for process in self.processes:
            process.kill()
            process.wait()


def held(seconds: list[float], alone_median: float) -> dict:
    kept = sorted(s - alone_median for s in seconds[WARM:])
    return {"appends": len(kept), "hold_p50_seconds": round(statistics.median(kept), 3),
            "hold_p90_seconds": round(kept[int(0.9 * (len(kept) - 1))], 3), "hold_max_seconds": round(kept[-1], 3),
            "seconds": [round(s, 3) for s in seconds]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--appends", type=int, default=25)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    results = ResultFile("upkeep-probe")
    session = delta_session(master=args.master)
    work = Path(tempfile.mkdtemp(prefix="upkeep-probe-"))
    source = str(work / "upkeep_source")
    append(rows(session, UPKEEP_ROWS, 0), TABLE, source)
    clicks = str(work / "clicks")
    conditions = {
        "beside two busy processes at nice 10": lambda: BusyProcesses(),
        "beside an upkeep loop at normal priority": lambda: UpkeepLoop(source, work / "normal", lowered=False),
        "beside an upkeep loop lowered (as the pipeline runs it)":
            lambda: UpkeepLoop(source, work / "low", lowered=True),
    }
    alone = timed_appends(session, args.appends, args.rows, clicks, 0)
    alone_median = statistics.median(alone[WARM:])
    workload = {"rows_per_append": args.rows, "appends": args.appends, "upkeep_rows": UPKEEP_ROWS,
                "master": args.master, "upkeep_tasks_lowered": task_priority.raising_permitted()}
    out: dict = {"workload": workload,
                 "alone_median_seconds": round(alone_median, 3), "conditions": {"alone": held(alone, alone_median)}}
    for index, (name, beside) in enumerate(conditions.items(), start=1):
        with beside() as load:
            seconds = timed_appends(session, args.appends, args.rows, clicks, index * args.appends)
        out["conditions"][name] = {**held(seconds, alone_median), "rewrites": getattr(load, "rewrites", None)}
        print(name, out["conditions"][name]["hold_p50_seconds"], out["conditions"][name]["hold_max_seconds"],
              file=sys.stderr)
    print(f"written to {results.write(out)}")


if __name__ == "__main__":
    main()
