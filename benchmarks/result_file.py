"""A benchmark's result file: one head saying what ran where, and one name for every script.

The head is taken when the benchmark starts: the commit measured is the one checked out then
(marked `-dirty` when the tracked files differ from it), not whatever is checked out when a long
run ends. The file is `<results dir>/<date>-<name>-<commit>.json`; a long run may write it more
than once (chaos.py after each scenario), the head unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"


def commit() -> str:
    """The commit checked out, marked `-dirty` when the tracked files differ from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip()
    return head + ("-dirty" if dirty else "")


def cpu_calibration_seconds() -> float:
    """The best of five timings of a fixed loop of Python: how fast a core of this machine runs, so
    that results of two machines of the same size compare. Machines handed out as the same two cores
    differ: the demo's run took 38.8 s on one and 17.4 s on the next, at the same code (2026-11-29).
    The best, since anything else running only slows a timing down."""
    timings = []
    for _ in range(5):
        started = time.perf_counter()
        total = 0
        for i in range(1_000_000):
            total += i * i % 7
        timings.append(time.perf_counter() - started)
    return round(min(timings), 4)


def machine() -> dict:
    """The machine (its speed: `cpu_calibration_seconds`), and whether Photon's JVMs start from the
    class archive setup made here (resources/spark/class_archive.py; PHOTON_JVM_OPTIONS's `-Xshare:off`
    turns it off for a run)."""
    from resources.spark.class_archive import archive_in_use
    from resources.spark.session import JVM_OPTIONS_ENV

    archive = archive_in_use(os.environ.get(JVM_OPTIONS_ENV, ""))
    return {"cpus": os.cpu_count(), "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "python": sys.version.split()[0], "jvm_class_archive": archive.name if archive else None,
            "cpu_calibration_seconds": cpu_calibration_seconds()}


def photon_environment() -> dict:
    """The PHOTON_* variables the benchmark ran under (a JVM option or a setting tried for a run), so
    that a result says what it measured besides the commit."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("PHOTON_")}


class ResultFile:
    """Where a benchmark writes its result, and the head every result starts with."""

    def __init__(self, benchmark: str, name: str | None = None, results_dir: Path = RESULTS):
        self.head = {"benchmark": benchmark, "date": date.today().isoformat(), "commit": commit(),
                     "machine": machine(), "command": " ".join(sys.argv), "environment": photon_environment()}
        self.path = Path(results_dir) / f"{self.head['date']}-{name or benchmark}-{self.head['commit']}.json"

    def renamed(self, benchmark: str) -> "ResultFile":
        """The same head (commit, start date, command) for another result of the same run."""
        other = ResultFile.__new__(ResultFile)
        other.head = {**self.head, "benchmark": benchmark}
        other.path = self.path.with_name(f"{self.head['date']}-{benchmark}-{self.head['commit']}.json")
        return other

    def write(self, body: dict) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({**self.head, **body}, indent=2, sort_keys=True) + "\n")
        return self.path
