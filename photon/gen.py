"""Synthetic workload generator (`photon gen`): query and click logs to join.

Layout written under ``<data_dir>/logs``::

    <datacenter>/<stream>/<ip>_<pid>/<seq>.jsonl      stream: query | click

* Every datacenter directory is a replica. Those without a replication lag
  hold the same relative names and the same bytes (each chunk is written to
  the first datacenter, then to the others).
* A lagging replica (``replication_lag``, batch mode only,
  ``--replication-lag dc2=30,dc3=inf``) is skipped by the writers; once the
  workload is written it is filled from the first datacenter (the source,
  which cannot lag) by :func:`photon.replication.replicate` with the cutoff
  ``last_event_us - lag``, where ``last_event_us`` is the largest
  ``timestamp_us`` of any complete line of the workload. Each of its files is
  the source file up to (not including) the first line past the cutoff, lines
  without a timestamp travel along; a file that would be empty is absent, and
  so are a writer's files after one that is cut. It holds complete lines
  only, so it lacks the torn last line. ``inf`` means replication is stopped:
  the replica has only its empty ``query/`` and ``click/`` directories.
  `photon replicate` resumes it later.
* Files are append-only UTF-8 JSON Lines. A writer starts a new file once its
  current one has reached ``rotate_bytes``; ``seq`` is zero-padded to five
  digits so that lexical order is write order (``00000.jsonl``, ...).
  A line never spans two files.
* Event ids are ``<ip>:<pid>:<timestamp_us>`` of the process that logged them,
  and the ``timestamp_us`` field equals the id's timestamp. A writer's events
  are in increasing timestamp order (clashes are bumped by 1 us); the only
  exception are duplicated click lines, which repeat an earlier line verbatim.

Writers: ``10.1.x.y`` query writers, ``10.2.x.y`` late query writers (a
delayed log shipment: their whole files arrive late), ``10.3.x.y`` click
writers; pids are drawn from the seed.

Batch mode is deterministic: the same config gives byte-identical output.
Follow mode appends in real time with wall-clock event timestamps.

With withhold_late / only_late, the cutoffs count the withheld late lines too, so
a withhold_late run followed by an only_late run (same options, lags included)
leaves every replica as one full run would: only_late writes the late files to
the datacenters without a lag, then replicates them to each lagging replica
with its cutoff (an ``inf`` replica stays empty).

Ground truth (returned by :func:`generate` and stored as JSON in
``<data_dir>/gen_summary.json``; counts are those of each replica without a
lag, the first datacenter included):

``config``                  the options (without withhold_late / only_late)
``late_withheld``           true while the late writers' files are withheld
``writers``                 writer directory names: query, late_query, click
``query_events``            valid query lines on disk
``late_query_events``       late queries (on disk unless withheld)
``withheld_late_query_events``  late queries not on disk yet
``click_lines``             valid click lines on disk, duplicates included
``distinct_click_ids``      distinct click ids among them
``duplicate_click_lines``   repeated click lines (click_lines - distinct_click_ids)
``orphan_clicks``           clicks whose query is never written anywhere
``joinable_clicks``         clicks whose query is on disk (late ones included
                            once written); a click with two lines counts once
``late_clicks``             clicks whose query is a late query
``bad_lines``               invalid complete lines (``bad_lines_by_stream``)
``torn_lines``              unterminated last lines (``torn_file`` names it)
``joinable_click_ids``, ``late_click_ids``, ``orphan_click_ids``,
``duplicate_click_ids``     the sorted ids behind those counts
``replicas``                per datacenter: ``lag_seconds`` (null: no lag,
                            a number, or the string "inf"), ``cutoff_us``
                            (null unless a finite lag), ``bytes`` on disk
"""

import argparse
import dataclasses
import heapq
import itertools
import json
import math
import os
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from photon.replication import create_stream_dirs, replicate

DEFAULT_START_TIME_US = 1_763_700_000_000_000
SUMMARY_FILE = "gen_summary.json"

_SEQ_DIGITS = 5
_DATACENTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
# Flush a writer's buffer to disk at the latest when this much is buffered.
_BUFFER_LIMIT = 1 << 20
# Share of clicked queries that get a second click (on a different ad).
_SECOND_CLICK_SHARE = 0.05
# Duplicate click lines reappear up to this long after the original.
_DUPLICATE_DELAY_MAX_US = 30_000_000

_AD_POOL = 50_000
_ADVERTISERS = 997
# Query words; none needs JSON escaping, a few are non-ASCII to exercise UTF-8.
_WORDS = (
    "cheap flights hotel berlin paris tokyo shoes running boots winter jacket "
    "laptop phone case charger pizza delivery near me weather tomorrow news "
    "café münchen zürich straße 東京 ramen piano lessons used car insurance "
    "garden tools yoga mat coffee beans"
).split()
_COUNTRIES = ("US", "DE", "FR", "JP", "BR", "IN", "GB", "CH")
_DEVICES = ("desktop", "mobile", "tablet")
_USER_AGENT_CLASSES = ("desktop_browser", "mobile_browser", "mobile_app")

# Bad line i is generated from template i % len(_BAD_LINE_TEMPLATES); the
# first five cover every kind in both streams, the over-long one included, and
# twelve add a byte that is not UTF-8 inside a string.
_BAD_LINE_TEMPLATES = (
    ("click", "not_json"),
    ("query", "not_object"),
    ("click", "missing_field"),
    ("query", "mistyped"),
    ("query", "overlong"),
    ("query", "not_json"),
    ("click", "not_object"),
    ("query", "missing_field"),
    ("click", "mistyped"),
    ("click", "overlong"),
    ("query", "bad_utf8"),
    ("click", "bad_utf8"),
)

# Written as the byte 0xff, which no UTF-8 text holds (Writer.append).
_NOT_UTF8 = "\udcff"

# Kinds of clicks, and actions in the simulation's event queue.
_JOINABLE, _LATE, _ORPHAN = range(3)
_CLICK, _DUPLICATE, _LATE_LINE, _BAD = range(4)


def _opt(default, help_text):
    return field(default=default, metadata={"help": help_text})


@dataclass
class GenConfig:
    """Options of `photon gen`; argparse dest names are these field names."""

    seed: int = _opt(1, "random seed; same options and seed give identical bytes")
    queries: int = _opt(20000, "query events to generate (batch mode)")
    span_seconds: float = _opt(3600.0, "event-time span of the queries (batch mode)")
    start_time_us: int = _opt(DEFAULT_START_TIME_US, "event time of the first query (batch mode)")
    query_writers: int = _opt(4, "query writer processes")
    click_writers: int = _opt(2, "click writer processes")
    late_writers: int = _opt(1, "late query writer processes (delayed log shipment)")
    click_share: float = _opt(0.1, "expected clicks per query")
    late_query_share: float = _opt(0.05, "share of queries logged by the late writers")
    orphan_click_share: float = _opt(0.01, "approximate share of clicks whose query is never logged")
    duplicate_click_share: float = _opt(0.01, "share of click lines written twice")
    bad_lines: int = _opt(5, "invalid lines mixed into query and click files")
    max_line_bytes: int = _opt(65536, "line length limit; one bad line exceeds it")
    torn_last_line: bool = _opt(True, "end one click writer's last file with a partial line")
    rotate_bytes: int = _opt(262144, "start a new file once a file has reached this size")
    datacenters: list[str] = field(default_factory=lambda: ["dc1"],
                                   metadata={"help": "replica datacenters, comma separated"})
    replication_lag: dict[str, float] = field(
        default_factory=dict,
        metadata={"help": "replicas that lag behind the first datacenter by SECONDS of event time"
                          " (inf: replication stopped), batch mode"})
    click_delay_mean_s: float = _opt(20.0, "mean delay from query to click (exponential)")
    click_delay_max_s: float = _opt(300.0, "cap on the query-to-click delay")
    withhold_late: bool = _opt(False, "do not write the late writers' files")
    only_late: bool = _opt(False, "write only the late writers' files withheld by an earlier --withhold-late run")
    follow: bool = _opt(False, "append in real time with wall-clock timestamps")
    rate: float = _opt(100.0, "clicks per second in follow mode (queries: rate / click_share)")
    duration_s: float = _opt(60.0, "run time in follow mode")
    late_delay_s: float = _opt(60.0, "delay of the late writers' lines in follow mode")
    flush_interval_s: float = _opt(0.5, "seconds between flushes in follow mode")

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise ValueError with a one-line message if an option is invalid."""
        for name in ("seed", "queries", "start_time_us", "query_writers", "click_writers",
                     "late_writers", "bad_lines", "max_line_bytes", "rotate_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        for name in ("span_seconds", "click_share", "late_query_share", "orphan_click_share",
                     "duplicate_click_share", "click_delay_mean_s", "click_delay_max_s",
                     "rate", "duration_s", "late_delay_s", "flush_interval_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        for name in ("torn_last_line", "withhold_late", "only_late", "follow"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("queries", "start_time_us", "bad_lines", "late_delay_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        for name in ("query_writers", "click_writers", "late_writers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("span_seconds", "click_delay_mean_s", "rate", "duration_s", "flush_interval_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("click_share", "late_query_share", "orphan_click_share", "duplicate_click_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be between 0 and 1, got {getattr(self, name)}")
        if self.click_delay_max_s < self.click_delay_mean_s:
            raise ValueError("click_delay_max_s must not be below click_delay_mean_s")
        if self.max_line_bytes < 1024:
            raise ValueError(f"max_line_bytes must be at least 1024, got {self.max_line_bytes}")
        if self.rotate_bytes < 1024:
            raise ValueError(f"rotate_bytes must be at least 1024, got {self.rotate_bytes}")
        if not isinstance(self.datacenters, list) or not self.datacenters:
            raise ValueError("datacenters must be a non-empty list of names")
        for name in self.datacenters:
            check_datacenter_name(name)
        if len(set(self.datacenters)) != len(self.datacenters):
            raise ValueError(f"datacenters must be distinct, got {','.join(self.datacenters)}")
        self._validate_replication_lag()
        if self.withhold_late and self.only_late:
            raise ValueError("withhold_late and only_late exclude each other")
        if self.follow and (self.withhold_late or self.only_late):
            raise ValueError("follow mode delays late writers by late_delay_s; withhold_late/only_late are batch only")
        if self.follow and self.click_share == 0:
            raise ValueError("follow mode needs click_share > 0 (the query rate is rate / click_share)")

    def _validate_replication_lag(self) -> None:
        lags = self.replication_lag
        if not isinstance(lags, dict):
            raise ValueError(f"replication_lag must map datacenters to seconds, got {lags!r}")
        unknown = sorted(set(lags) - set(self.datacenters), key=str)
        if unknown:
            raise ValueError(f"replication_lag names {', '.join(map(repr, unknown))}, not among the datacenters"
                             f" {','.join(self.datacenters)}")
        if self.datacenters[0] in lags:
            raise ValueError(f"{self.datacenters[0]} is the source replica (the first datacenter) and cannot lag")
        for dc, lag in lags.items():
            if not isinstance(lag, (int, float)) or isinstance(lag, bool) or math.isnan(lag) or lag < 0:
                raise ValueError(f"replication lag of {dc} must be a number of seconds >= 0 or inf, got {lag!r}")
        if self.follow and lags:
            raise ValueError("replication lag is for batch mode; use photon replicate")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one option per GenConfig field (--queries, --withhold-late, ...)."""
    group = parser.add_argument_group("workload generator")
    for f in dataclasses.fields(GenConfig):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata["help"]
        if isinstance(default, bool):
            # BooleanOptionalAction adds --no-<flag> and the default to the help.
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                               default=default, help=help_text)
        elif isinstance(default, list):
            group.add_argument(flag, dest=f.name, type=_comma_list, default=default,
                               metavar="DC[,DC...]", help=f"{help_text} (default: {','.join(default)})")
        elif isinstance(default, dict):
            group.add_argument(flag, dest=f.name, type=_lag_map, default=default,
                               metavar="DC=SECONDS[,DC=SECONDS...]", help=f"{help_text} (default: none)")
        else:
            group.add_argument(flag, dest=f.name, type=type(default), default=default,
                               help=f"{help_text} (default: %(default)s)")


def config_from_args(args: argparse.Namespace) -> GenConfig:
    """Build (and validate) a GenConfig from options added by add_arguments."""
    return GenConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(GenConfig)})


def _comma_list(value: str) -> list[str]:
    return [part.strip() for part in value.split(",")]


def _lag_map(value: str) -> dict[str, float]:
    """Parse "dc2=30,dc3=inf" (range checks are GenConfig.validate's)."""
    lags = {}
    for part in value.split(","):
        dc, equals, seconds = part.partition("=")
        dc = dc.strip()
        try:
            lag = float(seconds)
        except ValueError:
            lag = None
        if not equals or not dc or lag is None:
            raise argparse.ArgumentTypeError(f"expected DC=SECONDS[,DC=SECONDS...], got {value!r}")
        if dc in lags:
            raise argparse.ArgumentTypeError(f"datacenter {dc} is given twice in {value!r}")
        lags[dc] = lag
    return lags


def check_datacenter_name(name) -> None:
    """A datacenter name is one plain path component (no '/', no '..')."""
    if not isinstance(name, str) or not _DATACENTER_NAME.match(name):
        raise ValueError(f"invalid datacenter name {name!r}: use letters, digits, '.', '_' and '-'"
                         " and start with a letter or digit")


def generate(data_dir: Path, config: GenConfig) -> dict:
    """Write the logs under data_dir/logs, store and return the ground truth."""
    config.validate()
    data_dir = Path(data_dir)
    logs = data_dir / "logs"
    summary_path = data_dir / SUMMARY_FILE
    if config.only_late:
        _check_withheld_run(summary_path, config)
    elif logs.exists() and any(p.is_file() for p in logs.rglob("*")):
        raise ValueError(f"{logs} already contains files; generate into an empty data dir"
                         " (or use only_late to add withheld late files)")

    simulation = _Simulation(config, logs)
    if config.follow:
        simulation.run_follow()
    else:
        simulation.run_batch()
    summary = simulation.summary()
    summary["replicas"] = _fill_replicas(logs, config, simulation.last_event_us)

    tmp = summary_path.with_name(summary_path.name + ".tmp")
    tmp.write_text(json.dumps(summary, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, summary_path)
    return summary


def _config_record(config: GenConfig) -> dict:
    """The options that define the workload (what to write is not part of it)."""
    record = dataclasses.asdict(config)
    del record["withhold_late"], record["only_late"]
    record["replication_lag"] = {dc: _lag_record(lag) for dc, lag in config.replication_lag.items()}
    return record


def _lag_record(lag: float | None) -> float | str | None:
    """A lag as JSON: seconds, "inf" (JSON has no infinity), None for no lag."""
    if lag is None:
        return None
    return "inf" if math.isinf(lag) else float(lag)


def _fill_replicas(logs: Path, config: GenConfig, last_event_us: int) -> dict:
    """Replicate the first datacenter to every lagging one; describe every replica.

    A replica lagging by L seconds gets each file's lines up to the cutoff
    last_event_us - L (photon.replication); with an infinite lag it gets
    nothing but its stream directories. The other datacenters were written by
    the writers themselves.
    """
    source = logs / config.datacenters[0]
    replicas = {}
    for dc in config.datacenters:
        lag = config.replication_lag.get(dc)
        cutoff_us = None
        if lag is not None:
            create_stream_dirs(logs / dc)
            if not math.isinf(lag):
                cutoff_us = last_event_us - round(lag * 1e6)
                replicate(source, logs / dc, cutoff_us)
        size = sum(p.stat().st_size for p in (logs / dc).rglob("*.jsonl"))
        replicas[dc] = {"lag_seconds": _lag_record(lag), "cutoff_us": cutoff_us, "bytes": size}
    return replicas


def _check_withheld_run(summary_path: Path, config: GenConfig) -> None:
    try:
        previous = json.loads(summary_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"only_late needs {summary_path} from an earlier withhold_late run") from None
    if not previous.get("late_withheld"):
        raise ValueError(f"{summary_path} is not from a withhold_late run (or late files were already added)")
    if previous.get("config") != _config_record(config):
        raise ValueError("only_late must use the same options as the earlier withhold_late run")


class _Writer:
    """One logging process: mints its event ids and appends to rotating files.

    A writer with no target directories writes nothing but still does all the
    bookkeeping, so file names and ids match those of a run that writes it.
    """

    def __init__(self, stream: str, ip: str, pid: int, roots: list[Path], rotate_bytes: int):
        self.name = f"{ip}_{pid}"
        self.id_prefix = f"{ip}:{pid}:"
        self._rel_dir = f"{stream}/{self.name}"
        self._dirs = [root / stream / self.name for root in roots]
        self._rotate_bytes = rotate_bytes
        self._last_ts = -1
        self._seq = 0
        self._size = 0  # bytes of the current file, written or buffered
        self._created = False  # whether the current file exists yet
        self._mid_line = False  # whether the last append was a partial line
        self._buffer: list[bytes] = []
        self._buffered = 0

    @property
    def current_file(self) -> str:
        return f"{self._rel_dir}/{self._seq:0{_SEQ_DIGITS}d}.jsonl"

    def mint(self, ts: int) -> int:
        """Timestamp for an event at ts, bumped past this writer's last one."""
        ts = max(ts, self._last_ts + 1)
        self._last_ts = ts
        return ts

    def append(self, line: str, complete: bool = True) -> None:
        if self._size >= self._rotate_bytes and not self._mid_line:
            self._next_file()
        data = line.encode("utf-8", "surrogateescape")  # _NOT_UTF8 becomes its byte
        self._size += len(data)
        self._mid_line = not complete
        if self._dirs:
            self._buffer.append(data)
            self._buffered += len(data)
            if self._buffered >= _BUFFER_LIMIT:
                self.flush()

    def flush(self, hold_back: bool = False) -> None:
        """Write the buffer; with hold_back, keep the second half of the last
        line for the next flush so that readers see a partial line meanwhile."""
        if not self._buffer:
            return
        kept = b""
        if hold_back:
            last = self._buffer[-1]
            cut = len(last) // 2
            self._buffer[-1], kept = last[:cut], last[cut:]
        data = b"".join(self._buffer)
        self._buffer = [kept] if kept else []
        self._buffered = len(kept)
        if not data:
            return
        name = self.current_file.rsplit("/", 1)[1]
        for directory in self._dirs:
            if not self._created:
                directory.mkdir(parents=True, exist_ok=True)
            # "xb" on the first write: never append to a file of another run.
            with open(directory / name, "ab" if self._created else "xb") as f:
                f.write(data)
        self._created = True

    def _next_file(self) -> None:
        self.flush()
        if self._seq + 1 >= 10**_SEQ_DIGITS:
            raise RuntimeError(f"writer {self._rel_dir} exceeded {10**_SEQ_DIGITS - 1} files;"
                               " use a larger rotate_bytes")
        self._seq += 1
        self._size = 0
        self._created = False


class _Simulation:
    """Generates the workload in event-time order.

    Queries are produced in increasing time; everything that happens later
    (clicks, duplicate lines, bad lines, delayed late lines) waits in a heap
    and is emitted once the simulated (batch) or wall (follow) clock passes
    it. All randomness comes from one seeded Random consumed in a fixed order,
    and withhold_late/only_late only decide which writers reach the disk.
    """

    def __init__(self, config: GenConfig, logs: Path):
        self.cfg = config
        self.rng = random.Random(config.seed)
        # Lagging replicas are filled afterwards from the first datacenter.
        roots = [logs / dc for dc in config.datacenters if dc not in config.replication_lag]
        normal_roots = [] if config.only_late else roots
        late_roots = [] if config.withhold_late else roots

        def writers(stream, octet, count, roots):
            return [_Writer(stream, f"10.{octet}.{i // 250}.{i % 250 + 1}", self.rng.randrange(1000, 65536),
                            roots, config.rotate_bytes) for i in range(count)]

        self.query_writers = writers("query", 1, config.query_writers, normal_roots)
        self.late_writers = writers("query", 2, config.late_writers, late_roots)
        self.click_writers = writers("click", 3, config.click_writers, normal_roots)
        self.torn_writer = self.rng.choice(self.click_writers) if config.torn_last_line else None

        # Orphans come from "lost" queries; scaling by click_share makes them
        # about orphan_click_share of all clicks.
        self._orphan_prob = config.orphan_click_share * config.click_share
        # r < two: two clicks, two <= r < one: one click; so the expected
        # number of clicks per query (with two ads or more) is click_share.
        self._two_clicks_below = _SECOND_CLICK_SHARE * config.click_share
        self._one_click_below = config.click_share - self._two_clicks_below
        self._click_rate = 1e-6 / config.click_delay_mean_s
        self._click_delay_max_us = int(config.click_delay_max_s * 1e6)

        self._heap: list[tuple] = []
        self._order = itertools.count()  # heap tie-breaker: keeps FIFO order, never compares payloads
        self._last_query: tuple[str, list] | None = None
        self._now = 0
        # Largest timestamp_us of a complete line, withheld late lines included
        # (so that withhold_late + only_late gives the replicas of one run).
        self.last_event_us = config.start_time_us

        self.query_events = 0
        self.late_query_events = 0
        self.click_lines = 0
        self.click_ids = ([], [], [])  # by kind: joinable, late, orphan
        self.duplicate_ids: list[str] = []
        self.bad_lines = {"query": 0, "click": 0}
        self.torn_file: str | None = None

    # -- drivers -----------------------------------------------------------

    def run_batch(self) -> None:
        cfg, rng = self.cfg, self.rng
        span_us = max(1, int(cfg.span_seconds * 1e6))
        self._schedule_bad_lines(cfg.start_time_us, span_us)
        n = cfg.queries
        for i in range(n):
            # One query per slot of span/n, jittered: sorted and evenly spread.
            self._query(cfg.start_time_us + int((i + rng.random()) * span_us / n))
        self._finish(drop_pending_clicks=False)

    def run_follow(self) -> None:
        cfg, rng = self.cfg, self.rng
        queries_per_us = cfg.rate / cfg.click_share / 1e6
        interval_us = int(cfg.flush_interval_s * 1e6)
        start = last = tick = _wall_us()
        end = start + int(cfg.duration_s * 1e6)
        self._schedule_bad_lines(start, end - start)
        due = 0.0  # queries owed to the rate, fractional part carried over
        try:
            while last < end:
                tick = min(tick + interval_us, end)
                pause = (tick - _wall_us()) / 1e6
                if pause > 0:
                    time.sleep(pause)
                now = max(last, min(_wall_us(), end))
                due += (now - last) * queries_per_us
                count = int(due)
                due -= count
                for ts in sorted(last + 1 + int(rng.random() * (now - last)) for _ in range(count)):
                    self._query(ts)
                self._run_due(now)
                for writer in self._all_writers():
                    writer.flush(hold_back=writer is self.torn_writer)
                last = now
        except KeyboardInterrupt:
            pass  # stop early; _finish still leaves complete files and a summary
        # Clicks still pending lie in the future: they have not happened.
        self._finish(drop_pending_clicks=True)

    def _finish(self, drop_pending_clicks: bool) -> None:
        while self._heap:
            due, _, action, payload = heapq.heappop(self._heap)
            if not (drop_pending_clicks and action == _CLICK):
                self._dispatch(due, action, payload)
        if self.torn_writer is not None and self._last_query is not None:
            self._write_torn_line(self.torn_writer)
        for writer in self._all_writers():
            writer.flush()

    def _all_writers(self):
        return self.query_writers + self.late_writers + self.click_writers

    # -- events ------------------------------------------------------------

    def _push(self, due: int, action: int, payload) -> None:
        heapq.heappush(self._heap, (due, next(self._order), action, payload))

    def _run_due(self, now: int) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            due, _, action, payload = heapq.heappop(heap)
            self._dispatch(due, action, payload)
        self._now = max(self._now, now)

    def _dispatch(self, due: int, action: int, payload) -> None:
        self._now = max(self._now, due)
        if action == _CLICK:
            self._click(due, *payload)
        elif action == _DUPLICATE:
            writer, line, click_id = payload
            writer.append(line)
            self.click_lines += 1
            self.duplicate_ids.append(click_id)
        elif action == _LATE_LINE:
            writer, line = payload
            writer.append(line)
        else:
            self._bad_line(due, *payload)

    def _query(self, ts: int) -> None:
        self._run_due(ts)
        cfg, rng = self.cfg, self.rng
        late = rng.random() < cfg.late_query_share
        if late:
            writer = self.late_writers[int(rng.random() * len(self.late_writers))]
        else:
            writer = self.query_writers[int(rng.random() * len(self.query_writers))]
            if rng.random() < self._orphan_prob:
                # A query event lost before it reached the log: its id (from
                # this writer's sequence, so unique) is known only to a click.
                lost_id = f"{writer.id_prefix}{writer.mint(ts)}"
                self._schedule_click(ts, lost_id, self._ads()[0], _ORPHAN)
        qts = writer.mint(ts)
        self.last_event_us = max(self.last_event_us, qts)
        query_id = f"{writer.id_prefix}{qts}"
        ads = self._ads()
        line = _query_line(query_id, qts, self._text(), ads, self._extras())
        if late:
            self.late_query_events += 1
            if cfg.follow:
                self._push(qts + int(cfg.late_delay_s * 1e6), _LATE_LINE, (writer, line))
            else:
                writer.append(line)
        else:
            self.query_events += 1
            writer.append(line)
        self._last_query = (query_id, ads)

        kind = _LATE if late else _JOINABLE
        r = rng.random()
        if r < self._two_clicks_below and len(ads) > 1:
            for ad in rng.sample(ads, 2):
                self._schedule_click(qts, query_id, ad, kind)
        elif r < self._one_click_below:
            self._schedule_click(qts, query_id, ads[int(rng.random() * len(ads))], kind)

    def _schedule_click(self, query_ts: int, query_id: str, ad: tuple, kind: int) -> None:
        delay = min(int(self.rng.expovariate(self._click_rate)), self._click_delay_max_us)
        self._push(query_ts + max(1, delay), _CLICK, (query_id, ad, kind))

    def _click(self, ts: int, query_id: str, ad: tuple, kind: int) -> None:
        rng = self.rng
        writer = self.click_writers[int(rng.random() * len(self.click_writers))]
        cts = writer.mint(ts)
        self.last_event_us = max(self.last_event_us, cts)
        click_id = f"{writer.id_prefix}{cts}"
        line = _click_line(click_id, query_id, cts, ad, rng)
        writer.append(line)
        self.click_lines += 1
        self.click_ids[kind].append(click_id)
        if rng.random() < self.cfg.duplicate_click_share:
            due = cts + 1 + int(rng.random() * _DUPLICATE_DELAY_MAX_US)
            self._push(due, _DUPLICATE, (writer, line, click_id))

    def _ads(self) -> list[tuple]:
        rng = self.rng
        ads, seen = [], set()
        for position in range(1, 2 + int(rng.random() * 4)):
            ad = int(rng.random() * _AD_POOL)
            while ad in seen:
                ad = (ad + 1) % _AD_POOL
            seen.add(ad)
            bid = 10_000 + int(rng.random() * 4_990_000)
            ads.append((f"ad{ad}", f"adv{ad % _ADVERTISERS}", position, bid))
        return ads

    def _text(self) -> str:
        rng = self.rng
        return " ".join(_WORDS[int(rng.random() * len(_WORDS))] for _ in range(1 + int(rng.random() * 4)))

    def _extras(self) -> str:
        """Pass-through fields, already rendered; device is optional."""
        rng = self.rng
        extras = f',"country":"{_COUNTRIES[int(rng.random() * len(_COUNTRIES))]}"'
        if rng.random() < 0.5:
            extras += f',"device":"{_DEVICES[int(rng.random() * len(_DEVICES))]}"'
        return extras

    # -- bad and torn lines ------------------------------------------------

    def _schedule_bad_lines(self, start_us: int, span_us: int) -> None:
        for i in range(self.cfg.bad_lines):
            stream, kind = _BAD_LINE_TEMPLATES[i % len(_BAD_LINE_TEMPLATES)]
            self._push(start_us + int(self.rng.random() * span_us), _BAD, (stream, kind))

    def _bad_line(self, ts: int, stream: str, kind: str) -> None:
        """Write an invalid line; its id (if any) is a fresh one of its writer."""
        rng = self.rng
        oversize = "x" * self.cfg.max_line_bytes
        if stream == "query":
            writer = self.query_writers[int(rng.random() * len(self.query_writers))]
            qts = writer.mint(ts)
            event = {"query_id": f"{writer.id_prefix}{qts}", "timestamp_us": qts,
                     "query_text": self._text(), "ads": [_ad_dict(ad) for ad in self._ads()]}
            _spoil(event, kind, oversize, missing="ads", mistyped=("timestamp_us", "abc"), overlong="query_text",
                   bad_utf8="query_text")
        else:
            writer = self.click_writers[int(rng.random() * len(self.click_writers))]
            cts = writer.mint(ts)
            query_id, ads = self._last_query or (f"{self.query_writers[0].id_prefix}{ts}", self._ads())
            ad = ads[0]
            event = {"click_id": f"{writer.id_prefix}{cts}", "query_id": query_id, "timestamp_us": cts,
                     "ad_id": ad[0], "advertiser_id": ad[1], "cost_micros": ad[3]}
            _spoil(event, kind, oversize, missing="query_id", mistyped=("cost_micros", 1.5),
                   overlong="user_agent_class", bad_utf8="ad_id")
        text = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
        if kind == "not_json":
            text = text[: len(text) // 2] + "<<garbage"  # a corrupted, cut-off record
        elif kind == "not_object":
            text = json.dumps(list(event.values()), ensure_ascii=False)
        elif isinstance(event["timestamp_us"], int):
            self.last_event_us = max(self.last_event_us, event["timestamp_us"])
        writer.append(text + "\n")
        self.bad_lines[stream] += 1

    def _write_torn_line(self, writer: _Writer) -> None:
        """End the writer's last file with the first half of a new click line
        (a write in progress); that click is not part of the ground truth."""
        query_id, ads = self._last_query
        cts = writer.mint(self._now + 1)
        line = _click_line(f"{writer.id_prefix}{cts}", query_id, cts, ads[0], self.rng)
        writer.append(line[: len(line) // 2], complete=False)
        self.torn_file = writer.current_file

    # -- ground truth ------------------------------------------------------

    def summary(self) -> dict:
        late_on_disk = not self.cfg.withhold_late
        joinable, late, orphan = (sorted(ids) for ids in self.click_ids)
        joinable_now = sorted(joinable + late) if late_on_disk else joinable
        distinct = len(joinable) + len(late) + len(orphan)
        return {
            "config": _config_record(self.cfg),
            "late_withheld": not late_on_disk,
            "writers": {
                "query": [w.name for w in self.query_writers],
                "late_query": [w.name for w in self.late_writers],
                "click": [w.name for w in self.click_writers],
            },
            "query_events": self.query_events + (self.late_query_events if late_on_disk else 0),
            "late_query_events": self.late_query_events,
            "withheld_late_query_events": 0 if late_on_disk else self.late_query_events,
            "click_lines": self.click_lines,
            "distinct_click_ids": distinct,
            "duplicate_click_lines": len(self.duplicate_ids),
            "orphan_clicks": len(orphan),
            "joinable_clicks": len(joinable_now),
            "late_clicks": len(late),
            "bad_lines": sum(self.bad_lines.values()),
            "bad_lines_by_stream": dict(self.bad_lines),
            "torn_lines": 0 if self.torn_file is None else 1,
            "torn_file": self.torn_file,
            "joinable_click_ids": joinable_now,
            "late_click_ids": late,
            "orphan_click_ids": orphan,
            "duplicate_click_ids": sorted(self.duplicate_ids),
        }


def _wall_us() -> int:
    return time.time_ns() // 1000


def _spoil(event: dict, kind: str, oversize: str, *, missing: str, mistyped: tuple[str, object], overlong: str,
           bad_utf8: str) -> None:
    """Makes `event` a bad line of `kind`: a field missing, a field of the wrong type, a line over the
    length limit, or bytes that are not UTF-8 (the fields each stream's bad lines break are named)."""
    if kind == "missing_field":
        del event[missing]
    elif kind == "mistyped":
        event[mistyped[0]] = mistyped[1]
    elif kind == "overlong":
        event[overlong] = oversize
    elif kind == "bad_utf8":
        event[bad_utf8] += _NOT_UTF8


def _ad_dict(ad: tuple) -> dict:
    ad_id, advertiser_id, position, bid = ad
    return {"ad_id": ad_id, "advertiser_id": advertiser_id, "position": position, "bid_micros": bid}


# Valid lines are formatted directly (much faster than json.dumps); every
# interpolated string is an id or a vocabulary word that needs no escaping.

def _query_line(query_id: str, ts: int, text: str, ads: list[tuple], extras: str) -> str:
    ads_json = ",".join(
        f'{{"ad_id":"{a}","advertiser_id":"{v}","position":{p},"bid_micros":{b}}}' for a, v, p, b in ads
    )
    return f'{{"query_id":"{query_id}","timestamp_us":{ts},"query_text":"{text}","ads":[{ads_json}]{extras}}}\n'


def _click_line(click_id: str, query_id: str, ts: int, ad: tuple, rng: random.Random) -> str:
    ad_id, advertiser_id, _, bid = ad
    cost = 1 + int(rng.random() * bid)  # 1 <= cost <= bid
    user_agent = _USER_AGENT_CLASSES[int(rng.random() * len(_USER_AGENT_CLASSES))]
    return (f'{{"click_id":"{click_id}","query_id":"{query_id}","timestamp_us":{ts},"ad_id":"{ad_id}",'
            f'"advertiser_id":"{advertiser_id}","cost_micros":{cost},"user_agent_class":"{user_agent}"}}\n')
