"""Issue 6's benchmarks: Photon (`photon run`) side by side with the systems a user would pick instead.

Every system runs in its own process on the same generated logs (`photon gen`, fixed seed), one
after the other, nothing else running; a sampler adds up the resident memory of the process and
all its descendants (Python, the JVM, the registry server) every 0.2 s for the peak.

    python benchmarks/run.py backlog [--queries 2000000] [--seed 2026] [--systems photon,duckdb,spark-batch,streaming]
    python benchmarks/run.py scaling [--base-queries 250000] [--factors 1,2,4,8] [--systems photon,duckdb]
    python benchmarks/run.py live [--rate 1000] [--duration-s 300] [--drain-timeout-s 600] [--systems photon,streaming]
                                  [--mode embedded|daemon]
    python benchmarks/run.py peer-tuning [--rate 1000] [--duration-s 60] [--systems streaming,flink] [--only 0,2] [--name N]
                                         [--settings-per-system N]
    python benchmarks/run.py batch-cost

`flink` (Apache Flink's interval join, `peers.py flink` / `flink-live`) can be added to the
`--systems` of backlog, scaling and live (`--flink-watermark-seconds`, `--flink-checkpoint-seconds`).

Each writes `benchmarks/results/<date>-<workload>-<commit>.json` (`--results-dir`) and a PNG chart next to
it, and prints a Markdown table. `--work-dir` keeps the data directories (default: a temporary directory, removed).

Workloads:
- **backlog**: every log present at start; 2% of the queries logged by the late writer, 1% of the
  click lines duplicated (`photon gen --late-query-share 0.02 --duplicate-click-share 0.01`), ten
  clicks per hundred queries. Wall time to done, joined clicks/s, input MB/s, peak memory, and
  bytes written per input byte (output tables, registry, state and the Dagster instance for Photon;
  output and checkpoint for Structured Streaming; output and largest checkpoint for Flink; the
  Parquet output of the DuckDB and Spark batches).
- **scaling**: the backlog at several sizes; the growth exponent of wall time between the smallest
  and the largest (1.0 is linear). With the defaults the largest (8 x 250,000 queries) is the backlog
  workload itself, and its point is also written as the backlog result.
- **live**: `photon gen --follow` appends at a fixed rate with wall-clock timestamps while one
  `photon run --until-idle --min-seconds` tails the logs; then, on a new generator run with the same
  seed and rate, Structured Streaming's join runs continuously (`peers.py streaming-live`). A
  click's latency is Photon's definition for both: the commit time of the version of the joined
  Delta table that first contains it (from the Delta log) minus the click's `timestamp_us`; for
  Flink, whose sink commits a Parquet part file by renaming it when a checkpoint completes, the
  file's ctime (`part_file_latencies`). Photon's backlog (bytes on disk not yet cut into a work unit) is sampled every 5 s.
- **peer-tuning**: short live runs of the peers over a few settings each (`PEER_TUNING`, each
  system's defaults first): latency of all joinable clicks, completeness, peak memory; the best p90.
- **batch-cost**: the fixed cost of a micro-batch when each run gets its own process and JVM
  (what Dagster's default run launcher does) against runs inside `photon run`'s process, which
  share one Spark session, and against `photon up` (the daemon launches a process per run, each a
  client of one long-lived Spark Connect server): per run, time queued, launch to first Spark call,
  and the pass.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script: the project's packages and benchmarks.peers
from benchmarks.latency_stages import LogSampler, click_run_cost, hold_criterion, latency_stages, upkeep_hold  # noqa: E402
from benchmarks.result_file import RESULTS, ResultFile  # noqa: E402
from benchmarks import rate_curve as rate_curve_module  # noqa: E402
from benchmarks import repeats  # noqa: E402
from benchmarks.peers import DEFAULT_BOUND, flink_environment_missing  # noqa: E402 (DEFAULT_BOUND: the streaming peers' 300 s)
PYTHON = sys.executable
MB = 1_000_000
BACKLOG_MIN_QUERIES = 2_000_000  # the backlog workload: at least 2 million queries
SYSTEM_LABELS = {"photon": "Photon (photon run)", "photon-up": "Photon (photon up, the daemon)",
                 "photon-replicated": "Photon (photon run, three registry replicas)", "duckdb": "DuckDB batch", "spark-batch": "Spark batch",
                 "streaming": "Spark Structured Streaming", "flink": "Apache Flink (interval join)",
                 "photon-floor": "Photon's no-join floor", "streaming-floor": "Structured Streaming's no-join floor",
                 "flink-floor": "Flink's no-join floor"}
# The systems whose join runs after a session start of their own, reported apart: what a user waits
# for is the start and the join (`wall_to_done_seconds`), not what the peer does after it (the
# replay experiment, reading the input back to count bad lines).
SESSION_PEERS = ("streaming", "flink")
# Photon's state besides its output tables: all of it is written per input byte.
PHOTON_STATE_DIRS = ("warehouse", "registry", "state", "dagster")


# -- processes and their memory ------------------------------------------------

def process_tree_rss(root: int) -> dict[int, int]:
    """Resident bytes of a process and each of its descendants (pid -> bytes), from /proc. A child
    of a JVM running the JVM's own executable is one between its vfork and the exec of the command
    it was started for (the JVM runs `bash` for Hadoop's file permissions, Hadoop's native library
    being absent): it shares the JVM's memory, and counting it would count the JVM twice (in live
    runs, such children added 1.5-3 GB to peaks of 3.6-3.8 GB)."""
    return {pid: stat.rss for pid, stat in process_tree_stats(root).items()}


TICKS = os.sysconf("SC_CLK_TCK")


class ProcStat(tuple):
    """What /proc/<pid>/stat says of a process: (parent, start, rss bytes, own CPU seconds, CPU seconds
    of the children it has reaped)."""

    parent = property(lambda self: self[0])
    start = property(lambda self: self[1])
    rss = property(lambda self: self[2])
    own_cpu = property(lambda self: self[3])
    reaped_cpu = property(lambda self: self[4])


def process_tree_stats(root: int) -> dict[int, ProcStat]:
    """`ProcStat` of a process and each of its descendants (pid -> stat), from one scan of /proc,
    without the JVM's children between vfork and exec (see process_tree_rss)."""
    children: dict[int, list[int]] = {}
    stats: dict[int, ProcStat] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            children.setdefault(int(fields[1]), []).append(int(entry.name))
            stats[int(entry.name)] = ProcStat((int(fields[1]), int(fields[19]), int(fields[21]) * page,
                                               (int(fields[11]) + int(fields[12])) / TICKS,
                                               (int(fields[13]) + int(fields[14])) / TICKS))
        except (OSError, ValueError, IndexError):
            continue
    tree, stack = {}, [(root, None)]
    while stack:
        pid, parent = stack.pop()
        if pid not in stats or (parent is not None and _spawning_jvm(pid, parent)):
            continue
        tree[pid] = stats[pid]
        stack.extend((child, pid) for child in children.get(pid, []))
    return tree


class TreeCpu:
    """The CPU seconds (user + system) a process tree has used since its root started, from samples of
    /proc (`add`): every live process's own time and the time of the children it has reaped (the kernel
    adds a child's time, its own reaped children's included, to its parent's when the parent reaps it).
    A process that leaves the tree between two samples keeps counting with what it had used at the
    last: its parent's reaped time takes it over when it reaps it, and where the parent did not (the
    process was reparented outside the tree, or its parent ignores SIGCHLD), the process's last
    sampled time is kept apart (`carried`). What a process used after the last sample that saw it, or
    a process living less than one sample, is counted only where its parent reaped it. Per kind of
    process (`process_kind`): own time of each, and what its parent reaped of it stays the child's kind's
    (`moved`): `photon up`'s Spark JVM, reaped by `photon up` at its stop, is the JVM's time, not main's."""

    def __init__(self, root: int):
        self.root = root
        self.last: dict[tuple[int, int], ProcStat] = {}  # (pid, start) -> its last sample
        self.kinds: dict[tuple[int, int], str] = {}
        self.carried = 0.0
        self.carried_by_kind: dict[str, float] = {}
        self.moved: dict[str, float] = {}  # per kind: children's time its parents reaped, taken from the parent's kind
        self.seconds = 0.0
        self.by_kind: dict[str, float] = {}

    def add(self, tree: dict[int, ProcStat]) -> float:
        now = {(pid, stat.start): stat for pid, stat in tree.items()}
        for key in now:  # again at each sample: a child is its parent's command until it execs its own
            kind = process_kind(key[0], self.root)
            if kind != "gone":
                self.kinds[key] = kind
        by_pid = {pid: key for key in now for pid in (key[0],)}
        gone: dict[tuple[int, int], float] = {}  # parent key -> its children's last time that left
        for key, stat in self.last.items():
            if key in now:
                continue
            used = stat.own_cpu + stat.reaped_cpu
            parent = by_pid.get(stat.parent)
            if parent is not None and parent in self.last:
                gone[parent] = gone.get(parent, 0.0) + used
            else:
                self._carry(key, used)
        for parent, used in gone.items():
            taken = now[parent].reaped_cpu - self.last[parent].reaped_cpu
            share = min(1.0, max(0.0, taken) / used) if used > 0 else 1.0  # of the children's time, reaped
            for key, stat in self.last.items():
                if key not in now and by_pid.get(stat.parent) == parent:
                    child = stat.own_cpu + stat.reaped_cpu
                    if taken < used - 0.01:  # not reaped (yet) by the parent: keep what it had used
                        self._carry(key, child * (1 - share))
                    self._move(self.kinds.get(key, "gone"), self.kinds.get(parent, "gone"), child * share)
        self.last = now
        by_kind = dict(self.carried_by_kind)
        for kind, seconds in self.moved.items():
            by_kind[kind] = by_kind.get(kind, 0.0) + seconds
        for key, stat in now.items():
            kind = self.kinds.get(key, "gone")
            by_kind[kind] = by_kind.get(kind, 0.0) + stat.own_cpu + stat.reaped_cpu
        self.by_kind = by_kind
        self.seconds = self.carried + sum(stat.own_cpu + stat.reaped_cpu for stat in now.values())
        return self.seconds

    def _move(self, to_kind: str, from_kind: str, seconds: float) -> None:
        self.moved[to_kind] = self.moved.get(to_kind, 0.0) + seconds
        self.moved[from_kind] = self.moved.get(from_kind, 0.0) - seconds

    def _carry(self, key: tuple[int, int], used: float) -> None:
        self.carried += used
        kind = self.kinds.get(key, "gone")
        self.carried_by_kind[kind] = self.carried_by_kind.get(kind, 0.0) + used


def _spawning_jvm(pid: int, parent: int) -> bool:
    try:
        executable = os.readlink(f"/proc/{parent}/exe")
        return Path(executable).name == "java" and os.readlink(f"/proc/{pid}/exe") == executable
    except OSError:
        return False


def process_kind(pid: int, root: int) -> str:
    """What a process of the tree is, to say where the memory goes."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "gone"
    if not command[0]:  # exiting (its memory released: an empty command line); keep what it was
        return "gone"
    if pid == root:
        return "main"
    if Path(command[0]).name == "java":
        return "jvm"
    if any(arg.endswith(("pyspark.daemon", "worker_daemon")) for arg in command):
        return "python workers"
    if "registry" in command and "serve" in command:
        return "registry replicas" if "--replica" in command else "registry service"
    if Path(command[0]).name == "etcd":
        return "etcd members"
    return Path(command[0]).name


def proportional_bytes(pid: int) -> int:
    """A process's proportional set size: its resident pages, each shared one divided among the
    processes that map it (forked Python workers share most of theirs)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


# How often the sampler reads the tree's memory. A process's RSS comes from /proc/<pid>/stat (the
# scan of every process: ~3 ms of CPU); its PSS from /proc/<pid>/smaps_rollup, for which the kernel
# walks the process's page tables: 43 ms of CPU for a live JVM (2026-12-01, a machine calibrated at
# 0.086 s). Read every 0.2 s and every second, the sampler thread took 17 % of a core on two cores
# beside a live run at 1,000 clicks/s (py-spy: 54 % of its samples in smaps_rollup, 31 % in the scan),
# CPU the system under test did not get.
SAMPLE_SECONDS = 0.5
PSS_EVERY = 2  # samples: the tree's PSS is summed every second
# The PSS of a process that shares its memory with no other process of the tree (no fork of it, or
# it of another, without an exec: a JVM, the registry service, `photon run` itself) is its RSS less
# what it shares with the rest of the machine (libraries, files mapped), which moves only when those
# mappings do: between two readings of its smaps_rollup, PSS_MAX_AGE_SECONDS apart, it is its RSS less
# the difference the last reading found. A forked family's (Python workers, `photon up`'s run server and
# its runs) is read at every pass: its pages gain and lose sharers as its members come and go, and its
# members are small, cheap to read.
PSS_MAX_AGE_SECONDS = 10.0


def process_start(pid: int) -> int | None:
    """A process's start time (clock ticks since boot): with its pid, what names one process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _parent_and_command(pid: int) -> tuple[int | None, bytes]:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2:].split()[1]), Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return None, b""


def forked_families(tree: dict[int, int]) -> set[int]:
    """The processes of `tree` that share memory with another of it by a fork without an exec: a child
    running its parent's command line, and that parent."""
    seen = {pid: _parent_and_command(pid) for pid in tree}
    family = set()
    for pid, (parent, command) in seen.items():
        if parent in seen and command and seen[parent][1] == command:
            family.update((pid, parent))
    return family


class PssReader:
    """The tree's proportional set size, read process by process (see PSS_MAX_AGE_SECONDS for those
    derived from their RSS). A pass counts only if the tree listed after it is the one listed before it (the same pids,
    started at the same times): a page shared with a child that exits between two readings counts in
    both, so such a pass overstates what the tree held (round twenty-three put a `photon up` peak in
    such a sample)."""

    def __init__(self, root: int):
        self.root = root
        self._kept: dict[tuple[int, int | None], tuple[int, int, float]] = {}  # (pid, start) -> (rss, pss, at)

    def read(self, tree: dict[int, int], tries: int = 3) -> tuple[dict[int, int], dict[int, int]] | None:
        """(pid -> RSS, pid -> PSS) of a settled pass over the tree, starting from `tree` (pid -> RSS
        bytes, as process_tree_rss lists it); None when the tree changed during each of `tries` passes."""
        for _ in range(tries):
            starts = {pid: process_start(pid) for pid in tree}
            family = forked_families(tree)
            pss = {pid: self._pss(pid, starts[pid], rss, pid in family) for pid, rss in tree.items()}
            after = process_tree_rss(self.root)
            if after.keys() == tree.keys() and all(process_start(pid) == start for pid, start in starts.items()):
                self._kept = {key: value for key, value in self._kept.items() if key[0] in tree}
                return tree, pss
            tree = after
        return None

    def _pss(self, pid: int, start: int | None, rss: int, shares: bool) -> int:
        kept = self._kept.get((pid, start))
        now = time.monotonic()
        if not shares and kept and now - kept[2] < PSS_MAX_AGE_SECONDS:
            return max(0, rss - (kept[0] - kept[1]))
        pss = proportional_bytes(pid)
        self._kept[(pid, start)] = (rss, pss, now)
        return pss


class Measured:
    """A command run to completion with its wall time and the peak of its process tree's memory."""

    def __init__(self, command: list[str], log: Path, env: dict | None = None):
        self.command, self.log = command, log
        self.env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        self.peak_rss_bytes = 0
        # The tree's proportional set size, summed every PSS_EVERY samples: RSS counts the pages that
        # forked processes (Python workers, `photon up`'s run workers) share once per process.
        self.peak_pss_bytes = 0
        self.peak_breakdown: dict[str, dict[str, int]] = {}  # at the PSS peak: kind -> processes, rss, pss
        self.unsettled_pss_samples = 0  # PSS passes left out: the tree changed during each try
        self.cpu: TreeCpu | None = None  # the tree's CPU seconds, sampled with its memory
        self.exit_rusage_cpu_seconds: float | None = None  # the root's and its reaped descendants', at exit

    def start(self) -> "Measured":
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._stderr = open(self.log, "w")
        self.started = time.monotonic()
        self.process = subprocess.Popen(self.command, cwd=REPO, env=self.env, stdout=subprocess.PIPE,
                                        stderr=self._stderr, text=True)
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        return self

    def _sample(self) -> None:
        samples, reader = 0, PssReader(self.process.pid)
        self.cpu = TreeCpu(self.process.pid)
        while self.alive():
            stats = process_tree_stats(self.process.pid)
            if stats:
                self.cpu.add(stats)
            tree = {pid: stat.rss for pid, stat in stats.items()}
            self.peak_rss_bytes = max(self.peak_rss_bytes, sum(tree.values()))
            if samples % PSS_EVERY == 0:
                settled = reader.read(tree)
                if settled is None:
                    self.unsettled_pss_samples += 1
                elif sum(settled[1].values()) > self.peak_pss_bytes:
                    self.peak_pss_bytes = sum(settled[1].values())
                    self.peak_breakdown = self._by_kind(*settled)
            samples += 1
            time.sleep(SAMPLE_SECONDS)

    def _by_kind(self, rss: dict[int, int], pss: dict[int, int]) -> dict[str, dict[str, int]]:
        kinds: dict[str, dict[str, int]] = {}
        for pid in rss:
            kind = kinds.setdefault(process_kind(pid, self.process.pid), {"processes": 0, "rss": 0, "pss": 0})
            kind["processes"] += 1
            kind["rss"] += rss[pid]
            kind["pss"] += pss[pid]
        return kinds

    def alive(self) -> bool:
        """Whether the command still runs, without reaping it (Popen.poll would, and take its CPU
        time from `_communicate`)."""
        if self.process.returncode is not None:
            return False
        try:
            return os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
        except ChildProcessError:
            return False

    def cpu_seconds(self) -> float:
        """The tree's CPU seconds: sampled (TreeCpu), or at the root's exit its own and its reaped
        descendants' (from the kernel, `wait4`), whichever is more (a sample misses the last half second)."""
        sampled = self.cpu.seconds if self.cpu else 0.0
        return round(max(sampled, self.exit_rusage_cpu_seconds or 0.0), 2)

    def cpu_by_kind(self) -> dict[str, float]:
        return {kind: round(seconds, 2) for kind, seconds in sorted((self.cpu.by_kind if self.cpu else {}).items(),
                                                                    key=lambda kv: -kv[1])}

    def wait(self) -> str:
        stdout = self._communicate()
        self.wall_seconds = round(time.monotonic() - self.started, 2)
        self._sampler.join()
        self._stderr.close()
        if self.process.returncode not in (0, 1):
            tail = self.log.read_text(errors="replace").strip().splitlines()[-3:]
            raise SystemExit(f"{' '.join(self.command[:4])} exited {self.process.returncode}: {tail}")
        self.returncode = self.process.returncode
        return stdout

    def run(self) -> str:
        return self.start().wait()

    def _communicate(self) -> str:
        """The command's output once it has exited, reaped by wait4 for its CPU time (with that of
        every descendant reaped below it)."""
        stdout = self.process.stdout.read() if self.process.stdout else ""
        if self.process.returncode is None:
            try:
                _, status, usage = os.wait4(self.process.pid, 0)
                self.process.returncode = os.waitstatus_to_exitcode(status)
                self.exit_rusage_cpu_seconds = usage.ru_utime + usage.ru_stime
            except ChildProcessError:  # reaped already (Popen.poll)
                self.process.wait()
        if self.process.stdout:
            self.process.stdout.close()
        return stdout


def photon_command(*args: str) -> list[str]:
    return [PYTHON, "-m", "photon.cli", *args]


def generate(data_dir: Path, *options: str) -> dict:
    subprocess.run(photon_command("gen", "--data-dir", str(data_dir), *options), cwd=REPO, check=True,
                   env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL)
    return json.loads((data_dir / "gen_summary.json").read_text())


def log_bytes(data_dir: Path) -> int:
    """Input bytes of the replica every system reads (dc1)."""
    from benchmarks.peers import input_bytes

    return input_bytes(data_dir, "dc1")


# -- the systems ----------------------------------------------------------------

def joined_click_ids(table: Path) -> tuple[set[str], int]:
    """Distinct click ids of a Delta table read by the `deltalake` reader, and its row count."""
    from deltalake import DeltaTable

    ids = DeltaTable(str(table)).to_pyarrow_table(columns=["click_id"]).column("click_id").to_pylist()
    return set(ids), len(ids)


def run_photon(data_dir: Path, logs: Path, timeout_seconds: float = 6 * 3600) -> dict:
    from benchmarks.baseline import run_phases
    from benchmarks.peers import compare_with_truth, ground_truth, tree_bytes

    size = log_bytes(data_dir)
    measured = Measured(photon_command("run", "--data-dir", str(data_dir), "--until-idle", "--json",
                                       "--timeout-seconds", str(timeout_seconds)), logs / "photon.log")
    summary = json.loads(measured.run().strip().splitlines()[-1])
    ids, rows = joined_click_ids(data_dir / "warehouse" / "joined_clicks")
    written = {name: tree_bytes(data_dir / name) for name in PHOTON_STATE_DIRS}
    wall = measured.wall_seconds
    return {
        "system": "photon",
        "exit_code": measured.returncode,
        "wall_seconds": wall,
        # From `photon run`'s start to its exit: the output committed, and its final verification too.
        "wall_to_done_seconds": wall,
        "joined_rows": rows,
        "joined_distinct_clicks": len(ids),
        "duplicates_in_output": rows - len(ids),
        "joined_clicks_per_second": round(len(ids) / wall, 1),
        "input_bytes": size,
        "input_mb_per_second": round(size / MB / wall, 3),
        "peak_rss_bytes": measured.peak_rss_bytes,
        "peak_pss_bytes": measured.peak_pss_bytes,
        "peak_memory_by_process": measured.peak_breakdown,
        "unsettled_pss_samples": measured.unsettled_pss_samples,
        "bytes_written": written,
        "write_amplification": round(sum(written.values()) / size, 3),
        "runs": summary["runs"],
        "verification": summary["verification"],
        "summary": {k: summary[k] for k in ("clicks_seen", "distinct_clicks", "clicks_joined", "clicks_pending",
                                            "clicks_unjoinable", "duplicate_click_lines", "quarantined_lines")},
        "correctness": compare_with_truth(ids, ground_truth(data_dir)),
        # Where the time goes: runs per job and their mean length, the join's phases per click run.
        **run_phases(data_dir),
    }


def joined_rows(table: Path) -> int:
    """Rows of a Delta table from its log's per-file counts (0 before its first commit)."""
    from deltalake import DeltaTable

    if not (table / "_delta_log").is_dir():
        return 0
    return sum(DeltaTable(str(table)).get_add_actions(flatten=True).column("num_records").to_pylist())


def photon_up(data_dir: Path, logs: Path, env: dict | None = None) -> Measured:
    """`photon up` on the data directory (the daemon deployment), once its UI answers."""
    from resources.spark.connect_server import free_port

    measured = Measured(photon_command("up", "--data-dir", str(data_dir), "--port", str(free_port())),
                        logs / "photon-up.log", env).start()
    ready = measured.process.stdout.readline()
    if not ready.startswith("photon up:"):
        raise SystemExit(f"photon up did not start: {measured.log.read_text(errors='replace')[-2000:]}")
    return measured


def stop_up(measured: Measured) -> None:
    measured.process.send_signal(signal.SIGTERM)
    measured.wait()


def drained(data_dir: Path, joinable: int) -> bool:
    """Every joinable click joined, no run unfinished and no work unit awaiting its retry: a query run
    failed by a killed registry joins nothing (its clicks join from the query tailer's memory tier), but
    its quarantine and durable tier wait for the retry after its backoff."""
    import dagster as dg

    from photon.dagster_internals import instance_at
    from photon_assets.work_unit import UNFINISHED, work_units_awaiting_retry

    if joined_rows(data_dir / "warehouse" / "joined_clicks") < joinable:
        return False
    instance = instance_at(data_dir / "dagster")
    return (instance.get_runs_count(dg.RunsFilter(statuses=[*UNFINISHED])) == 0
            and not work_units_awaiting_retry(instance))


def daemon_runs(data_dir: Path) -> list[dict]:
    """Each successful work unit run of the daemon: its wall time from creation to end, time queued,
    launch to first Spark call, and the pass itself (its phases)."""
    import dagster as dg

    from photon.deployment import headless_instance
    from resources.state.layout import DataLayout

    instance = headless_instance(DataLayout(data_dir))
    runs = {r.dagster_run.run_id: r for r in instance.get_run_records(dg.RunsFilter(statuses=[dg.DagsterRunStatus.SUCCESS]))}
    out = []
    for asset in ("query_logs", "joined_clicks"):
        for event in instance.fetch_materializations(dg.AssetKey(asset), limit=10_000).records:
            metadata = {k: v.value for k, v in event.asset_materialization.metadata.items()}
            record = runs.get(event.run_id)
            if record is None or "launch_to_spark_seconds" not in metadata:
                continue
            out.append({
                "kind": "query" if asset == "query_logs" else "click",
                "run_seconds": round(record.end_time - record.create_timestamp.timestamp(), 2),
                "queued_seconds": metadata["queued_seconds"],
                "launch_to_spark_seconds": metadata["launch_to_spark_seconds"],
                "pass_seconds": round(sum(v for k, v in metadata.items() if k.startswith("phase_")), 2),
                "phases": {k: v for k, v in metadata.items() if k.startswith(("phase_", "join_")) and k.endswith("_seconds")},
                "delta_commits": metadata.get("delta_commits"),
            })
    return out


def peer_command(peer: str, data_dir: Path, out_dir: Path, *options: str) -> list[str]:
    return [PYTHON, str(REPO / "benchmarks" / "peers.py"), peer, "--data-dir", str(data_dir),
            "--out-dir", str(out_dir), *options]


def run_peer(peer: str, data_dir: Path, out_dir: Path, logs: Path, *options: str) -> dict:
    from benchmarks.peers import tree_bytes

    measured = Measured(peer_command(peer, data_dir, out_dir, *options), logs / f"{peer}.log")
    result = json.loads(measured.run())
    # The sampler can miss the peak of a sub-second process; the process's own high-water marks cannot.
    peak = max(measured.peak_rss_bytes, result.get("peak_rss_bytes") or 0, result.get("jvm_peak_rss_bytes") or 0)
    written = tree_bytes(out_dir / peer)
    if peer == "streaming":
        # The replay's checkpoint and rows are the duplicate experiment, not the join's cost.
        written = result["output_bytes"] + tree_bytes(out_dir / peer / "checkpoint-1")
    elif peer == "flink":
        # Flink deletes its checkpoints when the job ends: the output and the largest checkpoint's
        # state, as Flink logged it (its log is not counted).
        written = result["output_bytes"] + (result["checkpoints"]["max_state_bytes"] or 0)
    shutil.rmtree(out_dir / peer, ignore_errors=True)
    return {
        **result,
        "system": peer,
        # The peer's own clock (the join, without process and session start), the process's, and
        # what a user waits for the join: for Structured Streaming the session start and the first
        # availableNow run, not the replay experiment that follows in the same process; for Flink
        # the local cluster's start and the job, not the count of bad lines that follows.
        "join_wall_seconds": result["wall_seconds"],
        "process_wall_seconds": measured.wall_seconds,
        "wall_to_done_seconds": (round(result["session_start_seconds"] + result["wall_seconds"], 2)
                                 if peer in SESSION_PEERS else measured.wall_seconds),
        "peak_rss_bytes": peak,
        "peak_pss_bytes": measured.peak_pss_bytes,
        "peak_memory_by_process": measured.peak_breakdown,
        "unsettled_pss_samples": measured.unsettled_pss_samples,
        "bytes_written": written,
        "write_amplification": round(written / result["input_bytes"], 3),
    }


def run_systems(systems: list[str], data_dir: Path, work: Path, streaming_options: list[str],
                flink_options: list[str] = ()) -> dict:
    results = {}
    for system in systems:
        print(f"  {system} ...", file=sys.stderr, flush=True)
        if system == "photon":
            results[system] = run_photon(data_dir, work / "logs")
        elif system == "streaming":
            results[system] = run_peer("streaming", data_dir, work / "out", work / "logs", *streaming_options)
        elif system == "flink":
            results[system] = run_peer("flink", data_dir, work / "out", work / "logs", *flink_options)
        else:
            results[system] = run_peer(system, data_dir, work / "out", work / "logs")
    return results


def process_wall(result: dict) -> float:
    """Wall time to done, start-up included: what a user waits for."""
    return result.get("wall_to_done_seconds", result["wall_seconds"])


# -- workloads ------------------------------------------------------------------

def backlog_options(queries: int, seed: int) -> list[str]:
    return ["--queries", str(queries), "--seed", str(seed), "--late-query-share", "0.02",
            "--duplicate-click-share", "0.01"]


def streaming_options(files_per_trigger: int, watermark: str) -> list[str]:
    return ["--max-files-per-trigger", str(files_per_trigger), "--watermark", watermark]


def flink_options(args) -> list[str]:
    """The Flink peer's options from the command line (default watermark: the workload's span)."""
    options = ["--checkpoint-seconds", str(args.flink_checkpoint_seconds)]
    if args.flink_watermark_seconds is not None:
        options += ["--watermark-seconds", str(args.flink_watermark_seconds)]
    return options


def backlog(args, work: Path) -> dict:
    data_dir = work / "backlog"
    truth = generate(data_dir, *backlog_options(args.queries, args.seed))
    size = log_bytes(data_dir)
    results = run_systems(args.systems, data_dir, work, streaming_options(args.files_per_trigger, args.watermark),
                          flink_options(args))
    shutil.rmtree(data_dir, ignore_errors=True)
    return {"workload": workload_record(truth, {"queries_option": args.queries, "seed": args.seed,
                                                "input_bytes": size}),
            "systems": results, "targets": targets(results)}


def workload_record(truth: dict, options: dict) -> dict:
    keys = ("query_events", "click_lines", "distinct_click_ids", "duplicate_click_lines", "late_query_events",
            "orphan_clicks", "bad_lines")
    return {**options, **{k: truth[k] for k in keys}, "joinable_clicks": len(truth["joinable_click_ids"])}


def targets(results: dict) -> dict:
    """The issue's backlog targets, where the systems to compare with were run."""
    photon = results.get("photon")
    if photon is None:
        return {}
    out = {"joined_distinct_clicks_equal": len({r["joined_distinct_clicks"] for r in results.values()}) == 1}
    if "spark-batch" in results:
        out["wall_to_done_over_spark_batch"] = round(process_wall(photon) / process_wall(results["spark-batch"]), 2)
        out["wall_to_done_within_2x_of_spark_batch"] = out["wall_to_done_over_spark_batch"] <= 2
    if "streaming" in results:
        out["wall_to_done_over_streaming"] = round(process_wall(photon) / process_wall(results["streaming"]), 2)
        out["wall_to_done_at_most_half_of_streaming"] = out["wall_to_done_over_streaming"] <= 0.5
    if "streaming" in results:
        sss = results["streaming"]
        out["joined_per_second_vs_streaming"] = round(photon["joined_distinct_clicks"] / process_wall(photon)
                                                      / (sss["joined_distinct_clicks"] / process_wall(sss)), 3)
        out["joined_per_second_at_least_streaming"] = out["joined_per_second_vs_streaming"] >= 1.0
    if "flink" in results:
        flink = results["flink"]
        out["joined_per_second_vs_flink"] = round(photon["joined_distinct_clicks"] / process_wall(photon)
                                                  / (flink["joined_distinct_clicks"] / process_wall(flink)), 3)
    if "duckdb" in results:
        out["wall_over_duckdb_join"] = round(photon["wall_seconds"] / results["duckdb"]["wall_seconds"], 1)
        out["wall_over_duckdb_process"] = round(photon["wall_seconds"] / process_wall(results["duckdb"]), 1)
        out["within_10x_of_duckdb"] = out["wall_over_duckdb_process"] <= 10
    if "spark-batch" in results:
        # The same join once on Photon's engine: what Spark alone costs on this machine.
        spark_batch = process_wall(results["spark-batch"])
        out["wall_over_spark_batch_process"] = round(photon["wall_seconds"] / spark_batch, 1)
        if "duckdb" in results:
            out["spark_batch_over_duckdb_process"] = round(spark_batch / process_wall(results["duckdb"]), 1)
    return out


def scaling(args, work: Path) -> dict:
    points = []
    for factor in args.factors:
        queries = args.base_queries * factor
        print(f"scale {factor}x: {queries} queries", file=sys.stderr, flush=True)
        data_dir = work / f"scale-{factor}"
        truth = generate(data_dir, *backlog_options(queries, args.seed))
        # The replay (duplicates) experiment once, at the largest size.
        replay = [] if factor == args.factors[-1] else ["--no-replay"]
        results = run_systems(args.systems, data_dir, work,
                              streaming_options(args.files_per_trigger, args.watermark) + replay, flink_options(args))
        points.append({"factor": factor, "workload": workload_record(truth, {"queries_option": queries,
                                                                               "seed": args.seed}),
                       "input_bytes": log_bytes(data_dir), "systems": results})
        shutil.rmtree(data_dir, ignore_errors=True)
    growth = {}
    first, last = points[0], points[-1]
    for system in args.systems:
        ratio = process_wall(last["systems"][system]) / process_wall(first["systems"][system])
        size_ratio = last["input_bytes"] / first["input_bytes"]
        growth[system] = {"wall_ratio": round(ratio, 2), "size_ratio": round(size_ratio, 2),
                          "exponent": round(math.log(ratio) / math.log(size_ratio), 2)}
    return {"points": points, "growth": growth}


# -- live -------------------------------------------------------------------------

def undispatched_bytes(data_dir: Path, dc: str = "dc1") -> dict[str, int]:
    """Per stream: bytes on disk that the dispatcher has not yet cut into a work unit."""
    from benchmarks.peers import stream_dir
    from resources.state.layout import DataLayout
    from resources.state.work_unit_log import WorkUnitLog, log_files

    out = {}
    for stream in ("query", "click"):
        on_disk = sum(size for _, _, _, size in log_files(stream_dir(data_dir, dc, stream)))
        unit_log = DataLayout(data_dir).work_unit_log(dc, stream)
        dispatched = sum(u.bytes for u in WorkUnitLog.load(unit_log).units) if unit_log.exists() else 0
        out[stream] = on_disk - dispatched
    return out


def visible_latencies(table: Path) -> list[tuple[int, float]]:
    """(click timestamp_us, seconds until visible) of every click in a Delta table: the commit time
    of the first version whose added files hold it, minus its event time."""
    import pyarrow.parquet as pq

    first_seen: dict[str, tuple[int, float]] = {}
    log_dir = table / "_delta_log"
    for commit in sorted(log_dir.glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]
        committed_ms = next(a["commitInfo"]["timestamp"] for a in actions if "commitInfo" in a)
        for action in actions:
            if "add" not in action:
                continue
            rows = pq.read_table(table / action["add"]["path"], columns=["click_id", "timestamp_us"])
            for click_id, ts in zip(rows.column("click_id").to_pylist(), rows.column("timestamp_us").to_pylist()):
                if click_id not in first_seen:
                    first_seen[click_id] = (ts, committed_ms / 1e3 - ts / 1e6)
    return list(first_seen.values())


def part_file_latencies(table: Path) -> list[tuple[int, float]]:
    """(click timestamp_us, seconds until visible) of every click in a directory of Parquet part
    files committed by a rename (Flink's filesystem sink): the file's ctime, which the rename from
    its hidden in-progress name sets when its checkpoint completes (a poller saw each file 2-9 ms
    after it; its mtime, from when the writer closed it, is 50-100 ms earlier), minus the click's
    event time."""
    import pyarrow.parquet as pq

    first_seen: dict[str, tuple[int, float]] = {}
    for path in sorted(table.glob("part-*"), key=lambda p: p.stat().st_ctime):
        committed = path.stat().st_ctime
        rows = pq.read_table(path, columns=["click_id", "timestamp_us"])
        for click_id, ts in zip(rows.column("click_id").to_pylist(), rows.column("timestamp_us").to_pylist()):
            if click_id not in first_seen:
                first_seen[click_id] = (ts, committed - ts / 1e6)
    return list(first_seen.values())


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"count": 0}
    ordered = sorted(values)

    def at(q: float) -> float | None:
        value = ordered[min(len(ordered) - 1, int(q * len(ordered)))]
        return round(value, 2) if math.isfinite(value) else None  # None: never visible

    return {"count": len(ordered), "p50": at(0.50), "p90": at(0.90), "p99": at(0.99), "max": at(1.0)}


def prepare_feed(args, work: Path) -> dict | None:
    """For `--feed replay`: the workload pre-generated once (benchmarks/replay.py), in `args.pre_dir`."""
    if getattr(args, "feed", "gen") != "replay":
        return None
    from benchmarks.replay import pregenerate

    if args.late_query_share:
        raise SystemExit("--feed replay replays no late queries (a batch writes them in place, not delayed)")
    args.pre_dir = work / "pre"
    return pregenerate(args.pre_dir, args.rate, args.duration_s, args.seed, args.late_query_share)


def live(args, work: Path) -> dict:
    """Each system in turn tails its own generator run (same seed and rate), nothing else running."""
    prepare_feed(args, work)
    systems = {}
    for system in args.systems:
        print(f"  {system} ...", file=sys.stderr, flush=True)
        systems[system] = live_run(system, args, work / system)
    return {"workload": {"rate_clicks_per_second": args.rate, "duration_seconds": args.duration_s, "photon_mode": args.mode,
                         "late_query_share": args.late_query_share, "seed": args.seed,
                         "streaming_watermark": args.watermark, "streaming_join_window": args.join_window,
                         "flink_checkpoint_seconds": args.flink_checkpoint_seconds,
                         "flink_watermark_seconds": args.flink_watermark_seconds},
            "systems": systems}


LIVE_PEERS = {"streaming": "streaming-live", "flink": "flink-live",
              # The no-join floors (issue 73): the same input path and sink, nothing joined.
              "streaming-floor": "streaming-live", "flink-floor": "flink-live"}
# `photon-replicated`: `photon run` on the replicated registry (--registry-replicas 3: three etcd
# members and three replicas beside it, on the same two cores).
PHOTON_SYSTEMS = ("photon", "photon-up", "photon-replicated")
# Each system's no-join floor; Photon's is benchmarks/photon_floor.py (its engine, parser and Delta
# appends, without the dispatcher and Dagster's runs: a floor through those needs the product).
FLOORS = {"photon": "photon-floor", "photon-up": "photon-floor", "photon-replicated": "photon-floor",
          "streaming": "streaming-floor", "flink": "flink-floor"}
FLOOR_SYSTEMS = ("photon-floor", "streaming-floor", "flink-floor")


def live_peer_options(system: str, args) -> list[str]:
    """A live peer's options from the command line: its bounds, and where given its JVM options, state
    store or backend, incremental checkpoints, and Flink's shipper (the peers' own defaults otherwise)."""
    jvm = getattr(args, "peer_jvm_options", None)
    extra = ["--jvm-options", jvm] if jvm else []
    if system.startswith("streaming"):
        if getattr(args, "streaming_state_store", None):
            extra += ["--state-store", args.streaming_state_store]
        return ["--watermark", args.watermark, "--join-window", args.join_window, *extra]
    if getattr(args, "flink_state_backend", None):
        extra += ["--state-backend", args.flink_state_backend]
    if getattr(args, "flink_incremental_checkpoints", None) is False:
        extra += ["--no-incremental-checkpoints"]
    if getattr(args, "flink_shipper", None):
        extra += ["--shipper", args.flink_shipper]
    return flink_options(args) + extra


def peer_rotate_bytes(rate: float, seconds: float) -> int:
    """The rotation of the logs a file-fed peer gets (issue 73): a click writer's file complete about
    every `seconds` at `rate` (two click writers, ~240 bytes a click line), at most the generator's
    default 256 KiB and at least 4 KiB. At 250 clicks/s a 256 KiB click file takes ~9 s to fill: the
    peer could not see a click sooner; at 8,000/s it fills in a quarter of a second anyway."""
    from photon.gen import GenConfig

    per_writer = rate * CLICK_LINE_BYTES / GenConfig.click_writers
    return int(min(GenConfig.rotate_bytes, max(4096, per_writer * seconds)))


CLICK_LINE_BYTES = 240


def feed_command(args, system: str, data_dir: Path) -> list[str]:
    """What writes the live logs: `photon gen --follow` (feed `gen`), or the replayer of the rate's
    pre-generated logs (feed `replay`, benchmarks/replay.py, `args.pre_dir`). A file-fed peer (and its
    floor) gets its logs rotated small where `args.peer_rotate_seconds` is set (peer_rotate_bytes)."""
    rotate = None
    if system not in PHOTON_SYSTEMS and system != "photon-floor" and getattr(args, "peer_rotate_seconds", None):
        rotate = peer_rotate_bytes(args.rate, args.peer_rotate_seconds)
    if getattr(args, "feed", "gen") == "replay":
        return [PYTHON, str(REPO / "benchmarks" / "replay.py"), "play", "--source", str(args.pre_dir),
                "--data-dir", str(data_dir), *(["--rotate-bytes", str(rotate)] if rotate else [])]
    return photon_command("gen", "--data-dir", str(data_dir), "--follow", "--rate", str(args.rate),
                          "--duration-s", str(args.duration_s), "--seed", str(args.seed),
                          "--late-query-share", str(args.late_query_share),
                          *(["--rotate-bytes", str(rotate)] if rotate else []))


def live_run(system: str, args, work: Path, peer_options: list[str] | None = None) -> dict:
    """One live run of a system; peer_options replace the peer's options from the command line."""
    data_dir = work / "live"
    gen = Measured(feed_command(args, system, data_dir), work / "logs" / "gen.log").start()
    while not (data_dir / "logs" / "dc1" / "click").is_dir():
        if not gen.alive():
            raise SystemExit(f"the feed ended before writing: {gen.log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.1)
    started = time.time()
    timeout = str(args.duration_s + args.drain_timeout_s)
    table = data_dir / "warehouse" / "joined_clicks"
    # `photon-up`: Photon under its daemon deployment; `photon`: `photon run` (or the daemon with --mode daemon).
    photon = system in PHOTON_SYSTEMS
    floor = system in FLOOR_SYSTEMS
    daemon = system == "photon-up" or (system == "photon" and args.mode == "daemon")
    # Latencies are read back from the files each commit added (visible_latencies): table maintenance
    # compacts them, and must not delete the originals before the run ends.
    keep_files = {"PHOTON_SETTINGS": json.dumps({"query_cache_vacuum_retain_hours": 24})}
    options = None
    if daemon:
        measured = photon_up(data_dir, work / "logs", keep_files)
    elif system == "photon-floor":
        table = data_dir / "floor" / "clicks"
        measured = Measured([PYTHON, str(REPO / "benchmarks" / "photon_floor.py"), "--data-dir", str(data_dir),
                             "--timeout-seconds", timeout], work / "logs" / f"{system}.log").start()
    else:
        if photon:
            replicated = ["--registry-replicas", "3"] if system == "photon-replicated" else []
            command = photon_command("run", "--data-dir", str(data_dir), "--until-idle", "--json",
                                     "--min-seconds", str(args.duration_s), "--timeout-seconds", timeout, *replicated)
        else:
            table = work / "out" / LIVE_PEERS[system] / "joined_clicks"
            options = live_peer_options(system, args) if peer_options is None else peer_options
            options += ["--no-join"] if floor else []
            command = peer_command(LIVE_PEERS[system], data_dir, work / "out", *options, "--timeout-seconds", timeout)
        measured = Measured(command, work / "logs" / f"{system}.log", keep_files if photon else None).start()
    backlog_samples, generator_end = [], None
    sampler = LogSampler(data_dir / "logs" / "dc1" / "click").__enter__()  # where each click's time goes
    while measured.alive():
        if generator_end is None and not gen.alive():
            generator_end = time.time()
        if photon:
            backlog_samples.append({"t": time.time(), **undispatched_bytes(data_dir)})
        if daemon and generator_end is not None:
            # photon up runs until stopped: stop it once every joinable click is visible, or the
            # drain time is over (what is missing then counts as never visible).
            joinable = len(json.loads((data_dir / "gen_summary.json").read_text())["joinable_click_ids"])
            if drained(data_dir, joinable) or time.time() > generator_end + args.drain_timeout_s:
                stop_up(measured)
                break
        time.sleep(5 if photon else 1)
    sampler.__exit__()
    feed_output = gen.wait()
    generator_end = generator_end or time.time()
    if daemon:
        checked = subprocess.run(photon_command("check", "--data-dir", str(data_dir), "--json"), cwd=REPO,
                                 env=measured.env, capture_output=True, text=True)
        output = {"check": json.loads(checked.stdout.strip().splitlines()[-1]) if checked.stdout.strip() else None,
                  "runs": daemon_runs(data_dir)}
    else:
        stdout = measured.wait()
        output = (json.loads(stdout.strip().splitlines()[-1] if photon else stdout)
                  if stdout.strip() else None)
    truth = json.loads((data_dir / "gen_summary.json").read_text())
    if floor:  # a floor writes every valid click as read: all of them are expected, not only the joinable
        truth["joinable_click_ids"] = sorted({*truth["joinable_click_ids"], *truth["orphan_click_ids"]})
    if system.startswith("flink"):
        latencies = part_file_latencies(table) if table.is_dir() else []
    else:
        latencies = visible_latencies(table) if (table / "_delta_log").is_dir() else []
    by_minute: dict[int, list[float]] = {}
    for ts, latency in latencies:
        by_minute.setdefault(int(ts / 1e6 - started) // 60, []).append(latency)
    last_visible = max((ts / 1e6 + latency for ts, latency in latencies), default=None)
    size = log_bytes(data_dir)
    result = {
        "system": system,
        "mode": ("daemon" if daemon else "embedded") if photon else None,
        # What the generator achieved (it shares the 2 cores with the system).
        "generated": {"clicks_per_second": round(truth["click_lines"] / args.duration_s, 1),
                      "queries_per_second": round(truth["query_events"] / args.duration_s, 1),
                      "query_events": truth["query_events"], "click_lines": truth["click_lines"],
                      "input_bytes": size, "input_mb_per_second": round(size / MB / args.duration_s, 2)},
        "feed": feed_record(args, gen, feed_output),
        "exit_code": measured.returncode,
        "wall_seconds": measured.wall_seconds,
        # CPU seconds of the system's whole process tree (user + system, /proc and wait4), the
        # feed's (generator or replayer) apart in `feed`.
        "cpu_seconds": measured.cpu_seconds(),
        "cpu_seconds_by_process": measured.cpu_by_kind(),
        "cpu_seconds_per_1000_joined_clicks": (round(measured.cpu_seconds() / len(latencies) * 1000, 3)
                                               if latencies else None),
        "peak_rss_bytes": max(measured.peak_rss_bytes, (output or {}).get("jvm_peak_rss_bytes") or 0),
        "peak_pss_bytes": measured.peak_pss_bytes,
        "peak_memory_by_process": measured.peak_breakdown,
        "unsettled_pss_samples": measured.unsettled_pss_samples,
        ("summary" if photon else "peer"): output,
        **({"floor": True, "expected": "every valid click (a floor joins nothing)"} if floor else {}),
        # The peer's command-line options on top of its defaults (benchmarks/peers.py): its settings
        # are in `peer` once it reports, which a peer stopped at the drain timeout never does.
        **({} if photon else {"peer_options": options}),
        "joinable_clicks": len(truth["joinable_click_ids"]),
        "joined_visible": len(latencies),
        "latency_seconds": percentiles([latency for _, latency in latencies]),
        # Joinable clicks not visible when the system stopped count as infinitely late here.
        "latency_seconds_all_joinable": percentiles(
            [latency for _, latency in latencies] + [math.inf] * (len(truth["joinable_click_ids"]) - len(latencies))),
        "latency_by_minute_of_click_time": {str(m): percentiles(v) for m, v in sorted(by_minute.items())},
        "last_join_after_generator_stopped_seconds": round(last_visible - generator_end, 1) if latencies else None,
        "latency_histogram": latency_histogram([latency for _, latency in latencies]),
    }
    if photon:
        result["latency_stages_seconds"] = latency_stages(data_dir, sampler)
        result["click_run_cost"] = click_run_cost(data_dir / "dagster")
        result["upkeep_hold"] = upkeep_hold(data_dir / "dagster")
        result["upkeep_hold_criterion"] = hold_criterion(result["upkeep_hold"])
        result["backlog_bytes"] = [{"t": round(s["t"] - started, 1), "query": s["query"], "click": s["click"]}
                                   for s in backlog_samples]
    if args.keep_data:
        result["data_dir"] = str(work)
    else:
        shutil.rmtree(data_dir, ignore_errors=True)
        shutil.rmtree(work / "out", ignore_errors=True)
    return result


def feed_record(args, gen: Measured, output: str) -> dict:
    """What fed the run: `photon gen --follow` or the replayer, its CPU (the generator's own, apart
    from the system's) and, for the replayer, when it started and how late its ticks were."""
    record = {"kind": getattr(args, "feed", "gen"), "cpu_seconds": gen.cpu_seconds(), "wall_seconds": gen.wall_seconds}
    if record["kind"] == "replay" and output.strip():
        played = json.loads(output.strip().splitlines()[-1])
        record.update({k: played[k] for k in ("play_cpu_seconds", "shift_seconds", "shift_cpu_seconds",
                                              "start_late_seconds", "tick_late_seconds", "rotate_bytes")})
        # The tree's CPU counts the shift before the run too: the run's share is the play's.
        record["cpu_seconds"] = played["play_cpu_seconds"]
    return record


# -- the peers at their best: short live runs over a few of their settings -----------

# (label, the peer's options on top of the command line's): each system's defaults first.
# Options are explicit (the defaults changed with the sweep's results: benchmarks/peers.py).
_ROCKSDB = ["--state-backend", "rocksdb", "--heap", "8g"]
PEER_TUNING = {
    "streaming": [
        ("defaults: 8g driver, 2 shuffle partitions, default trigger", ["--shuffle-partitions", "2"]),
        ("4 shuffle partitions", ["--shuffle-partitions", "4"]),
        ("1 shuffle partition", ["--shuffle-partitions", "1"]),
        ("processing-time trigger 1 s", ["--shuffle-partitions", "2", "--trigger-seconds", "1"]),
        ("2g driver (Photon's)", ["--shuffle-partitions", "2", "--driver-memory", "2g"]),
        # Issue 73's re-sweep: the state store, and Photon's JVM options (serial collector, JIT thresholds).
        ("1 shuffle partition, HDFS-backed state store (Spark's default)",
         ["--shuffle-partitions", "1", "--state-store", "hdfs"]),
        ("1 shuffle partition, Photon's JVM options", ["--shuffle-partitions", "1", "--jvm-options", "photon"]),
    ],
    "flink": [
        ("defaults: checkpoint 1 s, parallelism 2, RocksDB", _ROCKSDB),
        ("parallelism 1", [*_ROCKSDB, "--parallelism", "1"]),
        ("checkpoint 0.5 s", [*_ROCKSDB, "--checkpoint-seconds", "0.5"]),
        ("checkpoint 2 s", [*_ROCKSDB, "--checkpoint-seconds", "2"]),
        ("heap state backend", ["--state-backend", "hashmap", "--heap", "8g"]),
        ("heap state backend, checkpoint 2 s", ["--state-backend", "hashmap", "--heap", "8g", "--checkpoint-seconds", "2"]),
        # Issue 73's re-sweep: RocksDB without incremental checkpoints, the heap with Photon's JVM options.
        ("RocksDB, full checkpoints", [*_ROCKSDB, "--no-incremental-checkpoints"]),
        ("heap state backend 16g, Photon's JVM options", ["--state-backend", "hashmap", "--heap", "16g",
                                                          "--jvm-options", "photon"]),
    ],
}
# What the sweeps found best (the peers' defaults since, benchmarks/peers.py): live, Structured
# Streaming with 1 shuffle partition, Flink with the heap state backend (given a 16 GiB heap for the
# 600 s of queries a long run holds).


def peer_tuning(args, work: Path) -> dict:
    """Each setting of PEER_TUNING (the first `--settings-per-system` of each system) in a live run
    of its own (`live_run`, same generator seed and rate): latency, completeness and peak memory."""
    runs = []
    prepare_feed(args, work)
    for system in args.systems:
        for n, (label, options) in enumerate(PEER_TUNING[system][:args.settings_per_system]):
            if args.only is not None and n not in args.only:
                continue
            print(f"  {system}: {label} ...", file=sys.stderr, flush=True)
            run = live_run(system, args, work / f"{system}-{n}", live_peer_options(system, args) + options)
            runs.append({"system": system, "setting": label, "options": options,
                         "settings": (run["peer"] or {}).get("settings"),
                         **{k: run[k] for k in ("latency_seconds", "latency_seconds_all_joinable", "joined_visible",
                                                "joinable_clicks", "peak_rss_bytes", "wall_seconds", "generated",
                                                "last_join_after_generator_stopped_seconds")}})
    best = {}
    for run in runs:
        p90 = run["latency_seconds_all_joinable"].get("p90")
        current = best.get(run["system"])
        if p90 is not None and (current is None or p90 < current["p90"]):
            best[run["system"]] = {"setting": run["setting"], "p90": p90}
    return {"workload": {"rate_clicks_per_second": args.rate, "duration_seconds": args.duration_s,
                         "late_query_share": args.late_query_share, "seed": args.seed},
            "runs": runs, "best_p90_of_all_joinable": best}


def peer_tuning_table(result: dict) -> str:
    rows = ["| system | setting | p50 | p90 | p99 | visible / joinable | peak memory |", "|---|---|---:|---:|---:|---:|---:|"]
    for run in result["runs"]:
        latency = run["latency_seconds_all_joinable"]
        rows.append(f"| {run['system']} | {run['setting']} | {latency.get('p50')} | {latency.get('p90')} | "
                    f"{latency.get('p99')} | {run['joined_visible']:,} / {run['joinable_clicks']:,} | "
                    f"{gib(run['peak_rss_bytes'])} |")
    return "\n".join(rows)


# -- fixed cost of a micro-batch --------------------------------------------------

BATCH_COST_PROBE = """
import json, sys, time
started = time.monotonic()
import definitions  # Dagster, the assets, sensors and resources: what a run process loads
loaded = time.monotonic()
from resources.spark.session import delta_session
spark = delta_session()
session = time.monotonic()
spark.range(1).count()
first_action = time.monotonic()
print(json.dumps({"import_definitions": loaded - started, "spark_session": session - loaded,
                  "first_action": first_action - session}))
"""


def batch_cost(args, work: Path) -> dict:
    """The fixed cost before (a process and a JVM per run, Dagster's default run launcher) and after
    (runs inside `photon run`, sharing its Spark session), both measured here: the first from
    fresh processes, the second from a `photon run` over a small workload's micro-batches."""
    fresh = []
    for _ in range(args.repeats):
        measured = Measured([PYTHON, "-c", BATCH_COST_PROBE], work / "logs" / "probe.log")
        phases = json.loads(measured.run().strip().splitlines()[-1])
        fresh.append({**{k: round(v, 3) for k, v in phases.items()}, "process": measured.wall_seconds})
    data_dir = work / "batch-cost"
    generate(data_dir, "--queries", str(args.queries), "--seed", str(args.seed), "--withhold-late")
    run_photon(data_dir, work / "logs")
    in_process = run_timings(data_dir)
    shutil.rmtree(data_dir, ignore_errors=True)
    mean = {k: round(statistics.mean(f[k] for f in fresh), 2) for k in fresh[0]}
    return {"process_per_run": {"samples": fresh, "mean": mean}, "in_process": in_process,
            "daemon": daemon_cost(args, work)}


def daemon_cost(args, work: Path) -> dict:
    """The same workload under `photon up`: each run a process of its own, launched by the daemon,
    a client of the long-lived Spark Connect server. Per run: queued, launch to first Spark call,
    the pass, creation to end; medians per kind of run."""
    data_dir = work / "batch-cost-daemon"
    truth = generate(data_dir, "--queries", str(args.queries), "--seed", str(args.seed), "--withhold-late")
    joinable = len(truth["joinable_click_ids"])  # the late queries are withheld: their clicks stay pending
    up = photon_up(data_dir, work / "logs")
    try:
        # Done: every joinable click joined and no run left unfinished (the click run's last step,
        # click_aggregates, follows its joined_clicks commit).
        deadline = time.monotonic() + 1800
        while not drained(data_dir, joinable) and time.monotonic() < deadline:
            time.sleep(2)
    finally:
        stop_up(up)
    runs = daemon_runs(data_dir)
    shutil.rmtree(data_dir, ignore_errors=True)
    medians = {
        kind: {key: round(statistics.median(r[key] for r in runs if r["kind"] == kind), 3)
               for key in ("run_seconds", "queued_seconds", "launch_to_spark_seconds", "pass_seconds")}
        for kind in ("query", "click") if any(r["kind"] == kind for r in runs)
    }
    return {"runs": runs, "median": medians}


def run_timings(data_dir: Path) -> dict:
    """From the Dagster instance: per run, creation to start, and each click run's Spark-session
    phase (zero when the session is shared)."""
    import dagster as dg
    from photon.dagster_internals import instance_at

    instance = instance_at(data_dir / "dagster")
    starts, durations = [], []
    for record in instance.get_run_records(dg.RunsFilter(statuses=[dg.DagsterRunStatus.SUCCESS])):
        starts.append(record.start_time - record.create_timestamp.timestamp())
        durations.append(record.end_time - record.start_time)
    sessions = [event.asset_materialization.metadata["phase_spark_session_seconds"].value
                for event in instance.fetch_materializations(dg.AssetKey("joined_clicks"), limit=1000).records
                if "phase_spark_session_seconds" in event.asset_materialization.metadata]
    return {"runs": len(starts), "mean_run_start_seconds": round(statistics.mean(starts), 3),
            "mean_run_seconds": round(statistics.mean(durations), 2),
            "spark_session_seconds_per_click_run": [round(s, 3) for s in sorted(sessions, reverse=True)]}


# -- reports --------------------------------------------------------------------

def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def backlog_table(result: dict) -> str:
    rows = ["| system | wall to done (join alone) | joined | joined/s | input MB/s | peak memory | bytes written per input byte | missed (late) | duplicates |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in result["systems"].items():
        wall = process_wall(r)
        duplicates = r.get("duplicates_in_output", r.get("duplicates_in_one_run", 0))
        rows.append(f"| {SYSTEM_LABELS[name]} | {wall:.1f} s (join {r['wall_seconds']:.1f} s) | "
                    f"{r['joined_distinct_clicks']:,} | {r['joined_distinct_clicks'] / wall:,.0f} | "
                    f"{r['input_bytes'] / MB / wall:.2f} | {gib(r['peak_rss_bytes'])} | {r['write_amplification']} | "
                    f"{r['correctness']['missing_clicks']} ({r['correctness']['missing_late_clicks']}) | {duplicates} |")
    return "\n".join(rows)


def backlog_title(result: dict) -> str:
    return (f"Backlog: {result['workload']['query_events']:,} queries, "
            f"{result['workload']['click_lines']:,} click lines")


def backlog_chart(result: dict, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["systems"])
    fig, ax = plt.subplots(figsize=(7, 4))
    values = [result["systems"][n]["joined_distinct_clicks"] / process_wall(result["systems"][n]) for n in names]
    bars = ax.bar([SYSTEM_LABELS[n] for n in names], values,
                  color=["#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd"][:len(names)])
    ax.bar_label(bars, fmt="%.0f")
    ax.set_ylabel("joined clicks per second (wall time to done)")
    ax.set_yscale("log")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def scaling_chart(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for system in result["growth"]:
        xs = [p["input_bytes"] / MB for p in result["points"]]
        ax.plot(xs, [process_wall(p["systems"][system]) for p in result["points"]], marker="o",
                label=SYSTEM_LABELS[system])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("input MB")
    ax.set_ylabel("wall seconds to done")
    ax.set_title("Backlog scaling")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def latency_histogram(latencies: list[float], bin_seconds: float = 1.0) -> dict:
    """Clicks per `bin_seconds` of latency, from the first bin holding one: what the chart draws,
    a few hundred numbers instead of one per click."""
    if not latencies:
        return {"bin_seconds": bin_seconds, "first_bin_seconds": None, "counts": []}
    bins = [math.floor(latency / bin_seconds) for latency in latencies]
    first = min(bins)
    counts = [0] * (max(bins) - first + 1)
    for b in bins:
        counts[b - first] += 1
    return {"bin_seconds": bin_seconds, "first_bin_seconds": first * bin_seconds, "counts": counts}


def live_chart(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with_backlog = any(run.get("backlog_bytes") for run in result["systems"].values())
    fig, axes = plt.subplots(1, 3 if with_backlog else 2, figsize=(16 if with_backlog else 11, 4))
    latency, by_minute = axes[:2]
    colors = {"photon": "#d62728", "photon-up": "#ff7f0e", "photon-replicated": "#9467bd", "streaming": "#1f77b4",
              "flink": "#2ca02c"}
    for system, run in result["systems"].items():
        label = "Photon (photon up: daemon)" if run.get("mode") == "daemon" else SYSTEM_LABELS[system]
        color = colors.get(system, "gray")
        histogram = run["latency_histogram"]
        if histogram["counts"]:
            start, width = histogram["first_bin_seconds"], histogram["bin_seconds"]
            edges = [start + i * width for i in range(len(histogram["counts"]) + 1)]
            latency.stairs(histogram["counts"], edges, fill=True, alpha=0.5, color=color,
                           label=f"{label}: p90 {run['latency_seconds']['p90']} s")
            latency.axvline(run["latency_seconds"]["p90"], linestyle="--", color=color, linewidth=0.8)
        minutes = run["latency_by_minute_of_click_time"]
        by_minute.plot([int(m) for m in minutes], [minutes[m].get("p90") for m in minutes], marker="o",
                       color=color, label=label)
        samples = run.get("backlog_bytes", [])
        for key, style in (("query", "-"), ("click", ":")):
            if samples:
                axes[2].plot([s["t"] for s in samples], [s[key] / MB for s in samples], style, color=color,
                             label=f"{key} bytes not dispatched")
    latency.set_xlabel("seconds from click to visible in joined_clicks")
    latency.set_ylabel("clicks")
    latency.set_title(f"Live, {result['workload']['rate_clicks_per_second']:g} clicks/s: latency")
    latency.legend()
    by_minute.set_xlabel("minute of click time")
    by_minute.set_ylabel("p90 latency (s)")
    by_minute.set_title("p90 per minute: bounded?")
    by_minute.legend()
    if with_backlog:
        axes[2].set_xlabel("seconds since start")
        axes[2].set_ylabel("MB")
        axes[2].set_title("Photon's backlog")
        axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, help="keep data and logs here (default: temporary, removed)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    workloads = parser.add_subparsers(dest="workload", required=True)
    for name in ("backlog", "scaling"):
        sub = workloads.add_parser(name)
        sub.add_argument("--seed", type=int, default=2026)
        sub.add_argument("--systems", type=lambda s: s.split(","),
                         default=["photon", "duckdb", "spark-batch", "streaming"],
                         help="photon, duckdb, spark-batch, streaming, flink")
        # About one Photon query work unit (32 MiB of 256 KiB files) per trigger.
        sub.add_argument("--files-per-trigger", type=int, default=128)
        sub.add_argument("--watermark", default=DEFAULT_BOUND, help="Structured Streaming's watermarks")
    workloads.choices["backlog"].add_argument("--queries", type=int, default=2_000_000)
    workloads.choices["scaling"].add_argument("--base-queries", type=int, default=250_000)
    workloads.choices["scaling"].add_argument("--factors", type=lambda s: [int(f) for f in s.split(",")],
                                              default=[1, 2, 4, 8])
    live_options = workloads.add_parser("live")
    tuning = workloads.add_parser("peer-tuning")
    curve = workloads.add_parser("rate-curve", help="issue 73: each system at rising rates (benchmarks/rate_curve.py)")
    rate_curve_module.add_arguments(curve)
    for sub in (live_options, tuning, curve):
        if sub is not curve:
            sub.add_argument("--rate", type=float, default=1000.0, help="clicks per second (queries: 10x)")
            sub.add_argument("--feed", choices=("gen", "replay"), default="gen",
                             help="photon gen --follow, or the workload pre-generated and replayed by wall clock")
        sub.add_argument("--duration-s", type=float, default={live_options: 300.0, tuning: 60.0, curve: 600.0}[sub])
        sub.add_argument("--drain-timeout-s", type=float, default=300.0 if sub is tuning else 600.0,
                         help="after the generator stops, give the system this long to finish")
        sub.add_argument("--peer-jvm-options", help="the peers' JVM options ('photon': Photon's collector and JIT "
                                                    "thresholds; default: each peer's own, Java's defaults)")
        sub.add_argument("--streaming-state-store", choices=("rocksdb", "hdfs"), help="default: the peer's (rocksdb)")
        sub.add_argument("--flink-state-backend", choices=("hashmap", "rocksdb"), help="default: the peer's (hashmap)")
        sub.add_argument("--no-flink-incremental-checkpoints", dest="flink_incremental_checkpoints",
                         action="store_false", default=None, help="RocksDB: full checkpoints")
        sub.add_argument("--flink-shipper", choices=("immediate", "ordered"),
                         help="Flink's files each the moment complete (the peer's default), or in batches of 32 with a wait")
        sub.add_argument("--peer-rotate-seconds", type=float, default=1.0 if sub is curve else None,
                         help="rotate the file-fed peers' logs so that a click file completes about this often "
                              "(run.py: peer_rotate_bytes; default: the generator's 256 KiB, rate-curve 1 s)")
        sub.add_argument("--late-query-share", type=float, default=0.0)
        sub.add_argument("--watermark", default=DEFAULT_BOUND, help="Structured Streaming's watermarks")
        sub.add_argument("--join-window", default=DEFAULT_BOUND,
                         help="Structured Streaming's join: click time <= query time + this")
        sub.add_argument("--seed", type=int, default=2026)
        sub.set_defaults(mode="embedded", keep_data=False)
    live_options.add_argument("--systems", type=lambda s: s.split(","), default=["photon", "streaming"],
                              help="photon, photon-up (the daemon), photon-replicated (three registry replicas), "
                                   "streaming, flink")
    live_options.add_argument("--mode", choices=("embedded", "daemon"), default="embedded",
                              help="Photon as `photon run` (runs in its process) or `photon up` (the daemon, a"
                                   " process per run, Spark Connect)")
    live_options.add_argument("--name", default="live", help="result file name (several rates)")
    live_options.add_argument("--keep-data", action="store_true",
                              help="keep the data directory (under --work-dir) to read every run back")
    tuning.add_argument("--systems", type=lambda s: s.split(","), default=["streaming", "flink"])
    curve.add_argument("--systems", type=lambda s: s.split(","), default=["photon", "photon-up", "streaming", "flink"],
                       help="photon, photon-up, photon-replicated, streaming, flink")
    curve.set_defaults(keep_data=False)
    merged = workloads.add_parser("merge", help="rate-curve, live or backlog results of the same product code as one"
                                                " (each figure's runs and min-max)")
    merged.add_argument("results", type=Path, nargs="+")
    merged.add_argument("--name", default=None, help="default: rate-curve-merged, or <first result's name>-repeats")
    tuning.add_argument("--settings-per-system", type=int, default=len(PEER_TUNING["flink"]),
                        help="run only the first N settings of each system (the defaults first)")
    tuning.add_argument("--only", type=lambda s: [int(n) for n in s.split(",")],
                        help="run only these settings (positions in each system's list, from 0)")
    tuning.add_argument("--name", default="peer-tuning", help="result file name (a second sweep)")
    for name, checkpoint in (("backlog", 5.0), ("scaling", 5.0), ("live", 1.0), ("peer-tuning", 1.0), ("rate-curve", 1.0)):
        sub = workloads.choices[name]
        sub.add_argument("--flink-watermark-seconds", type=float, default=None,
                         help="Flink's watermarks (default: the workload's event-time span for a backlog, the"
                              " click delay bound live)")
        sub.add_argument("--flink-checkpoint-seconds", type=float, default=checkpoint)
    cost = workloads.add_parser("batch-cost")
    cost.add_argument("--repeats", type=int, default=3)
    cost.add_argument("--queries", type=int, default=20000)
    cost.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    if getattr(args, "keep_data", False) and args.work_dir is None:
        parser.error("--keep-data needs --work-dir (a temporary work directory is removed)")
    if "flink" in (getattr(args, "systems", None) or []) and (missing := flink_environment_missing()):
        # Before any system runs: found only at Flink's turn, a live run had spent its other systems'
        # hour on a result file without Flink.
        parser.error(missing)

    # The head of every result this run writes, taken now: the commit measured is the one checked out at the start.
    results = ResultFile(args.workload, results_dir=args.results_dir)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="photon-bench-"))
    try:
        if args.workload == "backlog":
            result = backlog(args, work)
            path = results.renamed("backlog").write(result)
            backlog_chart(result, path.with_suffix(".png"), backlog_title(result))
            print(backlog_table(result))
        elif args.workload == "scaling":
            result = scaling(args, work)
            path = results.renamed("scaling").write(result)
            scaling_chart(result, path.with_suffix(".png"))
            largest = result["points"][-1]
            if largest["workload"]["query_events"] >= BACKLOG_MIN_QUERIES:
                # The largest point is the backlog workload itself (same generator options).
                backlog_result = {"workload": {**largest["workload"], "input_bytes": largest["input_bytes"]},
                                  "systems": largest["systems"], "targets": targets(largest["systems"])}
                backlog_path = results.renamed("backlog").write(backlog_result)
                backlog_chart(backlog_result, backlog_path.with_suffix(".png"), backlog_title(backlog_result))
            for point in result["points"]:
                print(f"\n{point['factor']}x ({point['input_bytes'] / MB:.0f} MB)\n" + backlog_table(point))
            print(json.dumps(result["growth"]))
        elif args.workload == "live":
            result = live(args, work)
            path = results.renamed(args.name).write(result)
            live_chart(result, path.with_suffix(".png"))
            print(json.dumps({system: {k: v for k, v in run.items() if k not in ("backlog_bytes", "latency_histogram")}
                              for system, run in result["systems"].items()}, indent=2))
        elif args.workload == "peer-tuning":
            result = peer_tuning(args, work)
            path = results.renamed(args.name).write(result)
            print(peer_tuning_table(result))
        elif args.workload == "rate-curve":
            out = results.renamed(args.name)
            result = rate_curve_module.rate_curve(args, work, live_run, out.write)
            path = out.write(result)
            rate_curve_module.chart(result, path.with_suffix(".png"), SYSTEM_LABELS)
            print(rate_curve_module.table(result))
        elif args.workload == "merge":
            inputs = [json.loads(p.read_text()) for p in args.results]
            if all(rate_curve_module.is_rate_curve(r) for r in inputs):
                result = rate_curve_module.merge(inputs)
                path = results.renamed(args.name or "rate-curve-merged").write(result)
                rate_curve_module.chart(result, path.with_suffix(".png"), SYSTEM_LABELS)
                print(json.dumps(result["max_rate_p90_under_10s"], indent=2))
            else:  # repeats of a live run or a backlog: a table, no chart
                result = repeats.merge(inputs)
                path = results.renamed(args.name or f"{inputs[0]['benchmark']}-repeats").write(result)
                print(repeats.table(result))
        else:
            result = batch_cost(args, work)
            path = results.renamed("batch_cost").write(result)
            print(json.dumps(result, indent=2))
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
