"""Pre-generated logs replayed by wall clock: the live workload at rates `photon gen --follow` cannot keep.

`photon gen --follow` draws every event in Python as it writes it: about one core at 8,000 clicks/s
(80,000 queries/s), on a two-core machine that the system under test needs. The replayer takes the
generator's work out of the measured window:

1. **pre-generate** (`pregenerate`): `photon gen` in batch mode, the live options (seed, rate, 10
   queries per click, the late query share; its event-time span is the run's duration), once per rate
   into a directory that later runs reuse: the same writers, file rotation and line order a follow run
   of those options writes (every writer's lines in event-time order, its files rotated at
   `--rotate-bytes`);
2. **plan** (`plan_replay`, cached beside it): per writer, the byte ranges of its files that fall due in
   each tick of `photon gen --follow`'s flush interval (0.5 s). A line falls due at its own
   `timestamp_us`, or, when it is behind an earlier line of its writer (a duplicated click line repeats
   its original) or has none (a bad line), with the line before it: the order of the lines is kept.
   Lines due after the run's end are not replayed, as a follow run stops at its end (it drops the
   clicks still to come);
3. **shift** (`shift_in_place`): every 16-digit timestamp of the pre-generated files, `timestamp_us` and
   the timestamp inside each event id alike (`<ip>:<pid>:<timestamp_us>`), moved by one offset so that
   the first tick falls a little after the shift ends: the lines keep their length, the files are
   rewritten in place (by two processes), before the measured window;
4. **play** (`Replayer`): at each tick, the byte ranges due copied (`os.copy_file_range`: no bytes
   through Python) onto the ends of the files of the live data directory, created as the generator
   creates them. The writer whose last line the generator tears (`torn_last_line`) has the second
   half of its last line of each tick held back to the next, as `photon gen --follow` holds it; its
   last file ends with the torn half line. `gen_summary.json` is written at the end, as the generator
   writes it, with the ground truth of the lines replayed (ids shifted).

Optionally the replayer rotates the files it writes at `rotate_bytes` instead of the source's
rotation (a file is closed once it has reached that size, at a line boundary): small files, for the peers
whose file sources read a file once it is complete.

    python benchmarks/replay.py play --source PRE --data-dir DIR [--rotate-bytes N] [--lead-seconds 5]

prints one JSON object: when the replay started (`start_us`), how late its ticks were, the CPU it
used while playing (`play_cpu_seconds`) and for the shift (`shift_cpu_seconds`).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import resource
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from photon.gen import DEFAULT_START_TIME_US, SUMMARY_FILE, GenConfig  # noqa: E402

TICK_SECONDS = GenConfig.flush_interval_s  # what `photon gen --follow` flushes at
PLAN_FILE = "replay-plan.pickle"
STATE_FILE = "replay-state.json"  # the pre-generated files' current shift
TIMESTAMP = re.compile(rb'"timestamp_us":(\d{16})(?!\d)')
CLICK_ID = re.compile(rb'"click_id":"([^"]+)"')
# Any 16-digit number standing alone: a `timestamp_us` value or the last part of an event id (bad
# lines included: json.dumps of a list puts a space before it). No other field holds 16 digits.
SIXTEEN_DIGITS = re.compile(rb"(?<![\d.])\d{16}(?![\d.])")


# -- pre-generation -------------------------------------------------------------------

def pregeneration_options(rate: float, duration_s: float, seed: int, late_query_share: float = 0.0,
                          rotate_bytes: int | None = None) -> list[str]:
    """`photon gen` batch options for the workload `photon gen --follow --rate R --duration-s D` writes."""
    queries = int(round(rate / GenConfig.click_share * duration_s))
    options = ["--queries", str(queries), "--span-seconds", str(duration_s), "--seed", str(seed),
               "--late-query-share", str(late_query_share), "--start-time-us", str(DEFAULT_START_TIME_US),
               "--datacenters", "dc1"]
    return options + (["--rotate-bytes", str(rotate_bytes)] if rotate_bytes else [])


def pregenerate(pre_dir: Path, rate: float, duration_s: float, seed: int, late_query_share: float = 0.0,
                python: str = sys.executable) -> dict:
    """The batch workload in `pre_dir` (made now, or kept from an earlier run with the same options and
    never left half-shifted), with its replay plan. Returns {"reused": bool, "seconds": ...}."""
    options = pregeneration_options(rate, duration_s, seed, late_query_share)
    marker = pre_dir / "pregeneration.json"
    state = pre_dir / STATE_FILE
    if marker.exists() and json.loads(marker.read_text()) == {"options": options} and (pre_dir / PLAN_FILE).exists():
        if not state.exists() or json.loads(state.read_text()).get("complete", False):
            return {"reused": True, "seconds": 0.0}
    shutil.rmtree(pre_dir, ignore_errors=True)
    started = time.monotonic()
    subprocess.run([python, "-m", "photon.cli", "gen", "--data-dir", str(pre_dir), *options], cwd=REPO, check=True,
                   env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL)
    plan = plan_replay(pre_dir, duration_s)
    (pre_dir / PLAN_FILE).write_bytes(pickle.dumps(plan))
    state.write_text(json.dumps({"shift_us": 0, "complete": True}))
    marker.write_text(json.dumps({"options": options}))
    return {"reused": False, "seconds": round(time.monotonic() - started, 1)}


# -- the plan -----------------------------------------------------------------------------

def due_times(data: bytes, running_us: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Each complete line of `data` (a writer's file): its end offset and the time it falls due (µs):
    its own `timestamp_us`, or that of the line before it where that is later or its own is missing;
    `running_us` is the writer's latest before this file. Returns (ends, dues, running_us after)."""
    buffer = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buffer == 10) + 1  # one past each line's newline
    dues = np.full(len(ends), -1, dtype=np.int64)
    if len(ends):
        positions, stamps = [], []
        for match in TIMESTAMP.finditer(data):
            positions.append(match.start())
            stamps.append(int(match[1]))
        if positions:
            lines = np.searchsorted(ends, np.array(positions), side="right")  # the line holding each match
            keep = lines < len(ends)  # a match in the torn tail belongs to no complete line
            np.maximum.at(dues, lines[keep], np.array(stamps, dtype=np.int64)[keep])
        dues[0] = max(dues[0], running_us)
        dues = np.maximum.accumulate(dues)
        running_us = int(dues[-1])
    return ends, dues, running_us


@dataclass
class WriterPlan:
    """One writer's replay: per tick, the byte ranges (file, start, end) due, and the torn tail."""

    stream: str
    name: str
    ranges: list[tuple[int, str, int, int]] = field(default_factory=list)  # (tick, file, start, end)
    torn_tail: tuple[str, int, int] | None = None  # (file, start, end) of an unterminated last line
    last_line_bytes: dict[int, int] = field(default_factory=dict)  # tick -> length of its last line (torn writer)
    click_ids: dict[bytes, int] = field(default_factory=dict)  # click writers: id -> lines replayed
    lines: int = 0


def plan_writer(stream: str, writer_dir: Path, start_us: int, end_us: int, tick_us: int) -> WriterPlan:
    """The ranges of one writer's files due in each tick (a line of due time t is in tick
    ceil((t - start) / tick), tick 0 holding what is due at the start), up to `end_us`."""
    plan = WriterPlan(stream, writer_dir.name)
    running = start_us
    for path in sorted(writer_dir.glob("*.jsonl")):
        data = path.read_bytes()
        ends, dues, running = due_times(data, running)
        rel = f"{stream}/{writer_dir.name}/{path.name}"
        keep = dues <= end_us
        kept = int(keep.sum()) if len(keep) else 0
        if kept:
            ticks = np.maximum(0, np.ceil((dues[:kept] - start_us) / tick_us).astype(np.int64))
            starts = np.concatenate(([0], ends[:kept - 1]))
            changes = np.flatnonzero(np.diff(ticks)) + 1
            bounds = np.concatenate(([0], changes, [kept]))
            for a, b in zip(bounds[:-1], bounds[1:]):
                tick = int(ticks[a])
                plan.ranges.append((tick, rel, int(starts[a]), int(ends[b - 1])))
                plan.last_line_bytes[tick] = int(ends[b - 1] - starts[b - 1])
            plan.lines += kept
            if stream == "click":
                for match in CLICK_ID.finditer(data, 0, int(ends[kept - 1])):
                    plan.click_ids[match[1]] = plan.click_ids.get(match[1], 0) + 1
        if kept < len(ends):
            break  # past the end: the writer's later files are not replayed
    files = sorted(writer_dir.glob("*.jsonl"))
    if files:  # the generator's torn half line ends the writer's last file
        data = files[-1].read_bytes()
        tail_start = data.rfind(b"\n") + 1
        if tail_start < len(data):
            plan.torn_tail = (f"{stream}/{writer_dir.name}/{files[-1].name}", tail_start, len(data))
    return plan


def plan_replay(pre_dir: Path, duration_s: float, tick_seconds: float = TICK_SECONDS) -> dict:
    """Every writer's plan (`plan_writer`) and the ground truth of the lines replayed (unshifted)."""
    summary = json.loads((pre_dir / SUMMARY_FILE).read_text())
    start_us = summary["config"]["start_time_us"]
    end_us = start_us + int(duration_s * 1e6)
    tick_us = int(tick_seconds * 1e6)
    logs = pre_dir / "logs" / "dc1"
    writers = [plan_writer(stream, writer_dir, start_us, end_us, tick_us)
               for stream in ("query", "click") for writer_dir in sorted((logs / stream).iterdir())
               if writer_dir.is_dir()]
    torn = next((w for w in writers if w.torn_tail), None)
    truth = replayed_truth(summary, writers)
    for writer in writers:
        writer.click_ids = {}  # counted in the truth: not kept in the plan
    return {"start_us": start_us, "end_us": end_us, "tick_us": tick_us, "duration_s": duration_s,
            "writers": writers, "torn_writer": torn.name if torn else None, "truth": truth}


def event_ts(event_id: str) -> int:
    return int(event_id.rsplit(":", 1)[1])


def replayed_truth(summary: dict, writers: list[WriterPlan]) -> dict:
    """The generator's ground truth restricted to the lines replayed: clicks whose line was replayed,
    their duplicate lines replayed, query lines (less the bad ones, all within the span)."""
    seen: dict[str, int] = {}
    for writer in writers:
        for click_id, lines in writer.click_ids.items():
            seen[click_id.decode()] = seen.get(click_id.decode(), 0) + lines
    kinds = {key: [i for i in summary[key] if i in seen]
             for key in ("joinable_click_ids", "late_click_ids", "orphan_click_ids")}
    valid = set(kinds["joinable_click_ids"]) | set(kinds["late_click_ids"]) | set(kinds["orphan_click_ids"])
    click_lines = sum(seen[i] for i in valid)
    query_lines = sum(w.lines for w in writers if w.stream == "query")
    return {
        **kinds,
        "click_lines": click_lines,
        "distinct_click_ids": len(valid),
        "duplicate_click_lines": click_lines - len(valid),
        "duplicate_click_ids": sorted(i for i in valid if seen[i] > 1),
        "query_events": query_lines - summary["bad_lines_by_stream"]["query"],
        "bad_lines": summary["bad_lines"],
        "bad_lines_by_stream": summary["bad_lines_by_stream"],
        "config": summary["config"],
        "writers": summary["writers"],
    }


def shifted_id(event_id: str, shift_us: int) -> str:
    prefix, ts = event_id.rsplit(":", 1)
    return f"{prefix}:{int(ts) + shift_us}"


def replay_summary(plan: dict, shift_us: int, torn_file: str | None) -> dict:
    """gen_summary.json of the replayed run: the generator's keys, ids shifted, `replayed` set."""
    truth = plan["truth"]
    ids = {key: sorted(shifted_id(i, shift_us) for i in truth[key])
           for key in ("joinable_click_ids", "late_click_ids", "orphan_click_ids", "duplicate_click_ids")}
    config = {**truth["config"], "follow": True, "duration_s": plan["duration_s"],
              "rate": round(truth["config"]["queries"] * truth["config"]["click_share"] / plan["duration_s"], 1),
              "start_time_us": plan["start_us"] + shift_us}
    return {
        "config": config,
        "replayed": True,
        "late_withheld": False,
        "writers": truth["writers"],
        "query_events": truth["query_events"],
        "late_query_events": 0,
        "withheld_late_query_events": 0,
        "click_lines": truth["click_lines"],
        "distinct_click_ids": truth["distinct_click_ids"],
        "duplicate_click_lines": truth["duplicate_click_lines"],
        "orphan_clicks": len(ids["orphan_click_ids"]),
        "joinable_clicks": len(ids["joinable_click_ids"]) + len(ids["late_click_ids"]),
        "late_clicks": len(ids["late_click_ids"]),
        "bad_lines": truth["bad_lines"],
        "bad_lines_by_stream": truth["bad_lines_by_stream"],
        "torn_lines": 1 if torn_file else 0,
        "torn_file": torn_file,
        "joinable_click_ids": sorted(ids["joinable_click_ids"] + ids["late_click_ids"]),
        "late_click_ids": ids["late_click_ids"],
        "orphan_click_ids": ids["orphan_click_ids"],
        "duplicate_click_ids": ids["duplicate_click_ids"],
    }


# -- the shift ------------------------------------------------------------------------------

def shift_bytes(data: bytes, shift_us: int) -> bytes:
    """Every standalone 16-digit number of `data` moved by `shift_us` (same length while it stays 16 digits)."""
    return SIXTEEN_DIGITS.sub(lambda m: b"%d" % (int(m[0]) + shift_us), data)


def _shift_file(job: tuple[str, int]) -> int:
    path, shift_us = job
    with open(path, "r+b") as f:
        data = f.read()
        shifted = shift_bytes(data, shift_us)
        if len(shifted) != len(data):
            raise ValueError(f"{path}: a shifted timestamp changed length")
        f.seek(0)
        f.write(shifted)
    return len(data)


def shift_in_place(pre_dir: Path, shift_us: int, processes: int = 2) -> float:
    """Moves every timestamp of the pre-generated logs by `shift_us` (relative to their current shift,
    kept in STATE_FILE); a shift cut short leaves the state incomplete (`pregenerate` starts over).
    Returns the CPU seconds the shifting processes used."""
    state_path = pre_dir / STATE_FILE
    state = json.loads(state_path.read_text())
    delta = shift_us - state["shift_us"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    if delta:
        state_path.write_text(json.dumps({"shift_us": state["shift_us"], "complete": False}))
        jobs = [(str(p), delta) for p in sorted((pre_dir / "logs").rglob("*.jsonl"))]
        with ProcessPoolExecutor(processes) as pool:
            for _ in pool.map(_shift_file, jobs, chunksize=16):
                pass
        state_path.write_text(json.dumps({"shift_us": shift_us, "complete": True}))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2)


SHIFT_BYTES_PER_SECOND = 40e6  # two shifting processes on two busy cores, a low guess (one alone: ~50 MB/s)


def shift_estimate_seconds(pre_dir: Path) -> float:
    return sum(p.stat().st_size for p in (pre_dir / "logs").rglob("*.jsonl")) / SHIFT_BYTES_PER_SECOND


# -- playing ------------------------------------------------------------------------------

def ticks_due(start_us: int, tick_us: int, now_us: int, done: int) -> range:
    """The ticks to play at `now_us`: every tick after the `done` first whose time has come (tick k's
    time is start + k * tick)."""
    if now_us < start_us:
        return range(done, done)
    return range(done, (now_us - start_us) // tick_us + 1)


class Replayer:
    """Plays a shifted plan into `logs` (the live data directory's logs/dc1) by wall clock."""

    def __init__(self, plan: dict, source: Path, logs: Path, rotate_bytes: int | None = None):
        self.plan, self.source, self.logs, self.rotate_bytes = plan, source, logs, rotate_bytes
        self.by_tick: dict[int, list[tuple[WriterPlan, str, int, int]]] = {}
        for writer in plan["writers"]:
            for tick, rel, start, end in writer.ranges:
                self.by_tick.setdefault(tick, []).append((writer, rel, start, end))
        self.last_tick = max(self.by_tick, default=0)
        self.out: dict[str, list] = {}  # writer -> [source file, output name, its size, held tail]
        self.lateness: list[float] = []

    def _target(self, writer: WriterPlan, rel: str, rotate: bool) -> tuple[Path, bool]:
        """The file to append `rel`'s bytes to: the source's name, or with rotate_bytes a name of the
        writer's own sequence, the next once the current one has reached rotate_bytes (`rotate`: not
        for the second half of a line)."""
        state = self.out.setdefault(writer.name, [None, None, 0, None])
        if self.rotate_bytes is None:
            if state[0] != rel:
                state[:3] = [rel, rel, 0]
        elif state[1] is None or (rotate and state[2] >= self.rotate_bytes):
            seq = 0 if state[1] is None else int(state[1].rsplit("/", 1)[1].split(".")[0]) + 1
            state[:3] = [rel, f"{writer.stream}/{writer.name}/{seq:05d}.jsonl", 0]
        target = self.logs / state[1]
        return target, state[2] == 0 and not target.exists()

    def _copy(self, writer: WriterPlan, rel: str, start: int, end: int, rotate: bool = True) -> None:
        target, new = self._target(writer, rel, rotate)
        if new:
            target.parent.mkdir(parents=True, exist_ok=True)
        # Not O_APPEND: copy_file_range refuses such a target; the offset is the file's end.
        fd = os.open(target, os.O_WRONLY | (os.O_CREAT | os.O_EXCL if new else 0), 0o644)
        try:
            with open(self.source / rel, "rb") as src:
                offset, left, at = start, end - start, os.fstat(fd).st_size
                while left > 0:
                    copied = os.copy_file_range(src.fileno(), fd, left, offset, at)
                    if copied <= 0:
                        raise OSError(f"copy_file_range gave {copied} for {rel}")
                    offset, at, left = offset + copied, at + copied, left - copied
        finally:
            os.close(fd)
        self.out[writer.name][2] += end - start

    def play_tick(self, tick: int) -> None:
        torn = self.plan["torn_writer"]
        held_now: dict[str, tuple] = {}
        for writer, rel, start, end in self.by_tick.get(tick, []):
            state = self.out.get(writer.name)
            if state and state[3]:  # the half line held back at the last tick, into its file
                self._copy(writer, *state[3], rotate=False)
                state[3] = None
            if writer.name == torn:
                if writer.name in held_now:  # not the tick's last range of the writer: all of it
                    self._copy(writer, *held_now[writer.name])
                held_now[writer.name] = (rel, start, end)
            else:
                self._copy(writer, rel, start, end)
        for name, (rel, start, end) in held_now.items():
            writer = next(w for w in self.plan["writers"] if w.name == name)
            # The tick's last range of this writer: all of it but the second half of its last line.
            hold = writer.last_line_bytes[tick] - writer.last_line_bytes[tick] // 2
            self._copy(writer, rel, start, end - hold)
            self.out[name][3] = (rel, end - hold, end) if hold else None

    def finish(self) -> str | None:
        """The held half lines written, the torn writer's last file ended with its torn half line;
        returns that file's name (relative to logs)."""
        for name, state in self.out.items():
            if state[3]:
                writer = next(w for w in self.plan["writers"] if w.name == name)
                self._copy(writer, *state[3], rotate=False)
                state[3] = None
        torn = next((w for w in self.plan["writers"] if w.name == self.plan["torn_writer"]), None)
        if torn is None or torn.torn_tail is None or torn.name not in self.out:
            return None
        rel, start, end = torn.torn_tail
        target = self.logs / self.out[torn.name][1]
        with open(target, "ab") as dst:
            dst.write((self.source / rel).read_bytes()[start:end])
        return self.out[torn.name][1]

    def run(self, start_us: int) -> dict:
        done = 0
        tick_us = self.plan["tick_us"]
        while done <= self.last_tick:
            now = time.time_ns() // 1000
            due = ticks_due(start_us, tick_us, now, done)
            for tick in due:
                self.lateness.append((now - (start_us + tick * tick_us)) / 1e6)
                self.play_tick(tick)
            done = max(done, due.stop)
            next_us = start_us + done * tick_us
            pause = (next_us - time.time_ns() // 1000) / 1e6
            if pause > 0:
                time.sleep(pause)
        late = sorted(self.lateness)
        return {"ticks": len(late), "tick_late_seconds": {"p50": round(late[len(late) // 2], 3),
                                                           "p99": round(late[len(late) * 99 // 100], 3), "max": round(late[-1], 3)}
                if late else None}


def play(source: Path, data_dir: Path, rotate_bytes: int | None = None, lead_seconds: float = 5.0) -> dict:
    """Shift `source` (a pre-generated directory with its plan) to start `lead_seconds` after the
    shift can end, then play it into `data_dir` by wall clock, and write its gen_summary.json."""
    plan = pickle.loads((source / PLAN_FILE).read_bytes())
    start_us = time.time_ns() // 1000 + int((shift_estimate_seconds(source) * 1.5 + lead_seconds) * 1e6)
    shift_started = time.monotonic()
    shift_cpu = shift_in_place(source, start_us - plan["start_us"])
    shift_seconds = time.monotonic() - shift_started
    late_start = max(0.0, time.time() - start_us / 1e6)
    if not late_start:  # the log directories appear at the start, as the generator's first flush makes them
        time.sleep(max(0.0, start_us / 1e6 - time.time()))
    logs = data_dir / "logs" / "dc1"
    for stream in ("query", "click"):
        (logs / stream).mkdir(parents=True, exist_ok=True)
    before = resource.getrusage(resource.RUSAGE_SELF)
    replayer = Replayer(plan, source / "logs" / "dc1", logs, rotate_bytes)
    played = replayer.run(start_us)
    torn_file = replayer.finish()
    after = resource.getrusage(resource.RUSAGE_SELF)
    summary = replay_summary(plan, start_us - plan["start_us"], torn_file)
    path = data_dir / SUMMARY_FILE
    path.with_name(path.name + ".tmp").write_text(json.dumps(summary, indent=1) + "\n")
    os.replace(path.with_name(path.name + ".tmp"), path)
    return {"start_us": start_us, "shift_seconds": round(shift_seconds, 1), "shift_cpu_seconds": shift_cpu,
            "start_late_seconds": round(late_start, 2), "rotate_bytes": rotate_bytes,
            "play_cpu_seconds": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2),
            **played, "click_lines": summary["click_lines"], "query_events": summary["query_events"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    pre = commands.add_parser("pregenerate")
    pre.add_argument("--pre-dir", type=Path, required=True)
    pre.add_argument("--rate", type=float, required=True)
    pre.add_argument("--duration-s", type=float, required=True)
    pre.add_argument("--seed", type=int, default=2026)
    pre.add_argument("--late-query-share", type=float, default=0.0)
    player = commands.add_parser("play")
    player.add_argument("--source", type=Path, required=True, help="a pre-generated directory (pregenerate)")
    player.add_argument("--data-dir", type=Path, required=True)
    player.add_argument("--rotate-bytes", type=int, help="rotate the files written at this size (default: the source's)")
    player.add_argument("--lead-seconds", type=float, default=5.0)
    args = parser.parse_args()
    if args.command == "pregenerate":
        print(json.dumps(pregenerate(args.pre_dir, args.rate, args.duration_s, args.seed, args.late_query_share)))
    else:
        print(json.dumps(play(args.source, args.data_dir, args.rotate_bytes, args.lead_seconds)), flush=True)


if __name__ == "__main__":
    main()
