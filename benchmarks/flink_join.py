"""Apache Flink's interval join of the click and query logs: the `flink` and `flink-live` peers.

This file runs in Flink's own virtual environment (`.venv-flink`, made by scripts/setup.sh):
PyFlink pins pyarrow, pandas, py4j and apache-beam to versions the project's `.venv` cannot share.
It imports the standard library and PyFlink only, nothing of the project; `benchmarks/peers.py`
runs it as a subprocess and compares its output with the generator's ground truth.

The job, in Flink SQL on the filesystem connector (docs/CONTRACTS.md: input logs):

* two JSON-lines sources, ``<logs>/click`` and ``<logs>/query`` (every file below them, nested by
  writer), with ``json.ignore-parse-errors``: a line that is not JSON, not an object or not
  convertible to the schema is skipped; rows missing a required field are filtered after the
  watermark (a NULL event time is read as 0, so that it cannot stop the job);
* event time from ``timestamp_us`` (milliseconds: Flink's time attributes have at most 3
  digits), a bounded-out-of-orderness watermark on each side;
* clicks deduplicated by ``click_id`` (first row in processing time: an insert-only stream, which
  an interval join needs), its state kept ``--dedup-ttl-seconds`` (0: for the whole run);
* the interval join: ``click_time BETWEEN query_time AND query_time + join window``;
* a Parquet sink (filesystem connector; ``flink-sql-parquet`` and Hadoop's client jars come from
  ``.cache/flink-jars``), whose part files are committed (renamed from a hidden in-progress file)
  when a checkpoint completes: exactly-once checkpoints every ``--checkpoint-seconds``.

Modes:

* ``backlog``: bounded sources (every file present at start), streaming runtime mode, until the
  sources are exhausted; the last files are committed by the final checkpoint.
* ``live``: the sources monitor their directories every ``--monitor-seconds`` for new files (a file
  is read once, when found: the caller ships only complete files). Once the caller has written
  ``--shipping-done`` (after its last shipment), the job runs until Flink has read every shipped
  file (the source readers log each split they finish), then until a checkpoint triggered after
  that has completed and no part file is in progress, and is cancelled: all output is committed.

Prints one JSON object: settings, session start, wall time of the job, input line counts (read
back after the timed part by a batch query: what the parser took and what the filter kept),
checkpoints, and the JVM's peak RSS.

    .venv-flink/bin/python benchmarks/flink_join.py backlog|live --logs DIR/logs/dc1 --out OUT
        [--jars .cache/flink-jars] [--watermark-seconds 300] [--join-window-seconds 300]
        [--checkpoint-seconds 5] [--parallelism 1] [--state-backend rocksdb|hashmap]
        [--dedup-ttl-seconds 0] [--heap 8g] [--managed-memory 2g]
        live: --shipping-done FILE [--monitor-seconds 1] [--timeout-seconds 3600]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

STARTED = time.monotonic()
REPO = Path(__file__).resolve().parent.parent
DEFAULT_JARS = REPO / ".cache" / "flink-jars"

CLICK_COLUMNS = ("click_id STRING", "query_id STRING", "timestamp_us BIGINT", "ad_id STRING",
                 "advertiser_id STRING", "cost_micros BIGINT")
AD = "ROW<ad_id STRING, advertiser_id STRING, `position` BIGINT, bid_micros BIGINT>"
QUERY_COLUMNS = ("query_id STRING", "timestamp_us BIGINT", "query_text STRING", f"ads ARRAY<{AD}>")


def interval(seconds: float) -> str:
    """A SQL interval literal of whole seconds (SECOND alone allows at most 99)."""
    s = int(round(seconds))
    return f"INTERVAL '{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}' HOUR TO SECOND"


def duration(seconds: float) -> str:
    """A Flink duration setting (whole milliseconds)."""
    return f"{int(round(seconds * 1000))} ms"


def required(columns: tuple[str, ...]) -> str:
    return " AND ".join(f"{c.split()[0]} IS NOT NULL" for c in columns)


def source_ddl(name: str, path: Path, columns: tuple[str, ...], time_column: str, watermark_seconds: float,
               monitor_seconds: float | None) -> str:
    monitor = f", 'source.monitor-interval' = '{duration(monitor_seconds)}'" if monitor_seconds else ""
    return f"""
        CREATE TEMPORARY TABLE {name} (
          {", ".join(columns)},
          {time_column} AS TO_TIMESTAMP_LTZ(COALESCE(timestamp_us, 0) / 1000, 3),
          proc_time AS PROCTIME(),
          WATERMARK FOR {time_column} AS {time_column} - {interval(watermark_seconds)}
        ) WITH ('connector' = 'filesystem', 'path' = 'file://{path}', 'format' = 'json',
                'json.ignore-parse-errors' = 'true'{monitor})"""


def statements(logs: Path, out: Path, watermark_seconds: float, join_window_seconds: float,
               monitor_seconds: float | None) -> tuple[list[str], str]:
    """The DDL and the INSERT of the join."""
    click_names = ", ".join(c.split()[0] for c in CLICK_COLUMNS)
    ddl = [
        source_ddl("clicks", logs / "click", CLICK_COLUMNS, "click_time", watermark_seconds, monitor_seconds),
        source_ddl("queries", logs / "query", QUERY_COLUMNS, "query_time", watermark_seconds, monitor_seconds),
        f"""CREATE TEMPORARY TABLE joined_clicks (
              {", ".join(CLICK_COLUMNS)},
              query ROW<query_id STRING, timestamp_us BIGINT, query_text STRING, ads ARRAY<{AD}>>
            ) WITH ('connector' = 'filesystem', 'path' = 'file://{out}', 'format' = 'parquet')""",
        f"""CREATE TEMPORARY VIEW unique_clicks AS
            SELECT {click_names}, click_time FROM (
              SELECT *, ROW_NUMBER() OVER (PARTITION BY click_id ORDER BY proc_time) AS n
              FROM clicks WHERE {required(CLICK_COLUMNS)})
            WHERE n = 1""",
        f"""CREATE TEMPORARY VIEW valid_queries AS
            SELECT * FROM queries WHERE {required(QUERY_COLUMNS)}""",
    ]
    insert = f"""
        INSERT INTO joined_clicks
        SELECT {", ".join("c." + c.split()[0] for c in CLICK_COLUMNS)},
               ROW(q.query_id, q.timestamp_us, q.query_text, q.ads)
        FROM unique_clicks c JOIN valid_queries q
          ON c.query_id = q.query_id
         AND c.click_time BETWEEN q.query_time AND q.query_time + {interval(join_window_seconds)}"""
    return ddl, insert


def floor_statements(logs: Path, out: Path, watermark_seconds: float, monitor_seconds: float | None) -> tuple[list[str], list[str]]:
    """The no-join floor: the same sources and sink, valid clicks written as read (no dedup, no
    join; the sink's query column NULL), valid queries read into the `blackhole` connector."""
    ddl, _ = statements(logs, out, watermark_seconds, 0, monitor_seconds)
    ddl.append("CREATE TEMPORARY TABLE dropped_queries WITH ('connector' = 'blackhole') LIKE queries (EXCLUDING ALL)")
    click_names = ", ".join(c.split()[0] for c in CLICK_COLUMNS)
    inserts = [
        f"""INSERT INTO joined_clicks
            SELECT {click_names}, CAST(NULL AS ROW<query_id STRING, timestamp_us BIGINT, query_text STRING, ads ARRAY<{AD}>>)
            FROM clicks WHERE {required(CLICK_COLUMNS)}""",
        f"INSERT INTO dropped_queries SELECT {', '.join(c.split()[0] for c in QUERY_COLUMNS)} FROM valid_queries",
    ]
    return ddl, inserts


def settings(args) -> dict[str, str]:
    """The job's Flink configuration."""
    conf = {
        "parallelism.default": str(args.parallelism),
        "execution.checkpointing.interval": duration(args.checkpoint_seconds),
        "execution.checkpointing.mode": "EXACTLY_ONCE",
        "execution.checkpointing.dir": f"file://{args.out / 'checkpoints'}",
        "state.backend.type": args.state_backend,
        # RocksDB: a checkpoint uploads only the new SST files (unless --no-incremental-checkpoints);
        # the heap backend snapshots it all.
        "execution.checkpointing.incremental": "true" if args.state_backend == "rocksdb" and args.incremental_checkpoints else "false",
        # The local cluster's RocksDB memory (block cache and write buffers).
        "taskmanager.memory.managed.size": args.managed_memory,
        # A failure ends the run with its error, instead of restarting from the last checkpoint.
        "restart-strategy.type": "none",
        "pipeline.name": f"photon-peer-flink-{args.mode}",
    }
    if args.dedup_ttl_seconds:
        conf["table.exec.state.ttl"] = duration(args.dedup_ttl_seconds)
    return conf


# -- the local cluster's log: what the source readers have read ---------------

ADDED = re.compile(r"Adding split\(s\) to reader: \[(.*)\]$")
SPLIT = re.compile(r"FileSourceSplit: file:(\S+) \[[^]]*\)[^=]*ID=(\d+)")
FINISHED = re.compile(r"Finished reading split\(s\) \[([\d, ]+)\]")
TRIGGERED = re.compile(r"Triggering checkpoint (\d+) .*@ (\d+)")
COMPLETED = re.compile(r"Completed checkpoint (\d+) for job \S+ \((\d+) bytes, checkpointDuration=(\d+) ms")


class LogFollower:
    """Reads the Flink log as it grows: files whose split a source reader finished (and when, by
    the JVM's clock in ms), checkpoints triggered (with their time) and completed.

    Each source numbers its splits from 1, and the reader's lines name a split by its number only:
    a number's "finished" line is taken for the oldest file added under that number and not yet
    finished. With two sources the attribution can be the other source's file for a while, but once
    every "finished" line of a number has been read, every file added under it is finished."""

    def __init__(self, log_dir: Path):
        self.log_dir, self._offset, self._path = log_dir, 0, None
        self.split_paths: dict[str, list[str]] = {}  # split id -> paths added under it, not yet finished
        self.finished: dict[str, int] = {}  # path -> ms
        self.triggered: dict[int, int] = {}  # checkpoint -> ms
        self.completed: dict[int, tuple[int, int]] = {}  # checkpoint -> (state bytes, duration ms)

    def poll(self) -> None:
        if self._path is None:
            logs = sorted(self.log_dir.glob("*.log"))
            if not logs:
                return
            self._path = logs[0]
        with open(self._path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        self._offset += end
        for line in chunk[:end].decode("utf-8", errors="replace").splitlines():
            if (m := ADDED.search(line)):
                for path, split_id in SPLIT.findall(m[1]):
                    self.split_paths.setdefault(split_id, []).append(path)
            elif (m := FINISHED.search(line)):
                for split_id in m[1].replace(" ", "").split(","):
                    if self.split_paths.get(split_id):
                        self.finished[self.split_paths[split_id].pop(0)] = log_ms(line)
            elif (m := TRIGGERED.search(line)):
                self.triggered[int(m[1])] = int(m[2])
            elif (m := COMPLETED.search(line)):
                self.completed[int(m[1])] = (int(m[2]), int(m[3]))


def log_ms(line: str) -> int:
    """The epoch milliseconds of a log line's local timestamp."""
    stamp = line[:23]
    seconds = time.mktime(time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S"))
    return int(seconds * 1000) + int(stamp[20:23])


def in_progress(out: Path) -> list[Path]:
    """Part files the sink has not committed yet (hidden until their checkpoint completes)."""
    return [p for p in out.rglob(".part-*") if p.is_file()] if out.is_dir() else []


def wait_until_all_committed(log: LogFollower, logs: Path, out: Path, shipping_done: Path, deadline: float,
                             poll_seconds: float = 0.1) -> dict:
    """Blocks until the caller's last shipment has been read and committed (see the module doc)."""
    while not shipping_done.exists():
        if time.monotonic() > deadline:
            raise SystemExit("flink-live: the caller did not finish shipping before the timeout")
        time.sleep(poll_seconds)
    expected = {str(p) for stream in ("click", "query") for p in (logs / stream).rglob("*.jsonl")
                if p.stat().st_size > 0}
    while True:
        log.poll()
        if expected <= log.finished.keys():
            break
        if time.monotonic() > deadline:
            missing = sorted(expected - log.finished.keys())
            raise SystemExit(f"flink-live: {len(missing)} shipped files not read before the timeout: {missing[:3]}")
        time.sleep(poll_seconds)
    read_ms = max(log.finished[p] for p in expected)
    while True:
        log.poll()
        # A checkpoint triggered after the last split was read (1 s later: records the fetcher had
        # queued are emitted before its barrier), complete, and no part file left in progress.
        after = [n for n, ms in log.triggered.items() if ms >= read_ms + 1000 and n in log.completed]
        if after and not in_progress(out):
            return {"last_split_read_ms": read_ms, "stopped_after_checkpoint": min(after)}
        if time.monotonic() > deadline:
            raise SystemExit("flink-live: no checkpoint completed after the input was read before the timeout")
        time.sleep(poll_seconds)


# -- counts and memory ----------------------------------------------------------

def line_counts(root: Path) -> dict:
    """Lines in every .jsonl file under root; an unterminated last line counts as one (torn)."""
    lines = torn = 0
    for path in root.rglob("*.jsonl"):
        data = path.read_bytes()
        lines += data.count(b"\n")
        if data and not data.endswith(b"\n"):
            torn += 1
    return {"lines": lines + torn, "torn_lines": torn}


def input_counts(logs: Path) -> dict:
    """Per stream: lines on disk, rows Flink's JSON format produced from them (the rest were
    skipped as unparseable), rows with every required field (the rest were filtered)."""
    from pyflink.table import EnvironmentSettings, TableEnvironment

    env = TableEnvironment.create(EnvironmentSettings.in_batch_mode())
    env.get_config().set("parallelism.default", "2")
    out = {}
    for name, columns in (("click", CLICK_COLUMNS), ("query", QUERY_COLUMNS)):
        env.execute_sql(f"""CREATE TEMPORARY TABLE raw_{name} ({", ".join(columns)})
            WITH ('connector' = 'filesystem', 'path' = 'file://{logs / name}', 'format' = 'json',
                  'json.ignore-parse-errors' = 'true')""")
        with env.execute_sql(f"SELECT COUNT(*), COUNT(*) FILTER (WHERE {required(columns)}) FROM raw_{name}"
                             ).collect() as rows:
            parsed, valid = next(iter(rows))
        counts = line_counts(logs / name)
        out[name] = {**counts, "parsed_rows": parsed, "valid_rows": valid,
                     "skipped_unparseable": counts["lines"] - parsed, "filtered_missing_field": parsed - valid}
    return out


def jvm_peak_rss_bytes() -> int | None:
    """VmHWM of the Java process this one started (PyFlink's gateway: the local cluster)."""
    me = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if stat[stat.rindex(")") + 2:].split()[1] != me:
                continue
            status = (entry / "status").read_text()
        except (OSError, ValueError, IndexError):
            continue
        if "java" in stat[:stat.rindex(")")]:
            match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
            return int(match[1]) * 1024 if match else None
    return None


def checkpoint_stats(log: LogFollower) -> dict:
    """Checkpoints of the job, with the state size and duration Flink logged for each."""
    log.poll()
    sizes = [size for size, _ in log.completed.values()]
    durations = sorted(ms for _, ms in log.completed.values())
    return {"triggered": len(log.triggered), "completed": len(log.completed),
            "max_state_bytes": max(sizes, default=None), "last_state_bytes": sizes[-1] if sizes else None,
            "duration_ms": {"p50": durations[len(durations) // 2], "max": durations[-1]} if durations else None}


# -- main -------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("backlog", "live"))
    parser.add_argument("--logs", type=Path, required=True, help="a datacenter's log directory (click/, query/)")
    parser.add_argument("--out", type=Path, required=True, help="output, checkpoints and Flink's log go here")
    parser.add_argument("--jars", type=Path, default=DEFAULT_JARS, help="flink-sql-parquet and Hadoop's client")
    parser.add_argument("--watermark-seconds", type=float, default=300.0, help="bounded out-of-orderness")
    parser.add_argument("--join-window-seconds", type=float, default=300.0, help="click time <= query time + this")
    parser.add_argument("--checkpoint-seconds", type=float, default=5.0)
    parser.add_argument("--parallelism", type=int, default=1)
    parser.add_argument("--state-backend", choices=("rocksdb", "hashmap"), default="rocksdb")
    parser.add_argument("--dedup-ttl-seconds", type=float, default=0.0, help="0: the dedup state is never expired")
    parser.add_argument("--heap", default="8g", help="the local cluster's JVM heap (-Xmx)")
    parser.add_argument("--managed-memory", default="2g", help="the local cluster's managed memory (RocksDB)")
    parser.add_argument("--monitor-seconds", type=float, default=1.0, help="live: how often sources list new files")
    parser.add_argument("--shipping-done", type=Path, help="live: the caller writes this after its last shipment")
    parser.add_argument("--timeout-seconds", type=float, default=3600.0)
    parser.add_argument("--no-input-counts", dest="input_counts", action="store_false",
                        help="skip reading the input back to count bad lines")
    parser.add_argument("--no-incremental-checkpoints", dest="incremental_checkpoints", action="store_false",
                        help="RocksDB: snapshot the whole state at each checkpoint")
    parser.add_argument("--jvm-options", default="", help="more options for the local cluster's JVM")
    parser.add_argument("--no-join", action="store_true", help="the no-join floor (floor_statements)")
    args = parser.parse_args()
    if args.mode == "live" and args.shipping_done is None:
        parser.error("live needs --shipping-done")
    args.logs, args.out = args.logs.resolve(), args.out.resolve()
    table = args.out / "joined_clicks"
    for previous in (table, args.out / "checkpoints", args.out / "flink-log"):
        shutil.rmtree(previous, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)

    jars = sorted(args.jars.glob("*.jar"))
    if not any(j.name.startswith("flink-sql-parquet") for j in jars):
        raise SystemExit(f"flink: no flink-sql-parquet jar in {args.jars} (run scripts/setup.sh)")
    # PyFlink's gateway reads these when it starts the JVM of the local cluster.
    os.environ["HADOOP_CLASSPATH"] = os.pathsep.join(str(j) for j in jars)
    os.environ["JVM_ARGS"] = f"-Xmx{args.heap} {args.jvm_options}".strip()
    os.environ["FLINK_LOG_DIR"] = str(args.out / "flink-log")

    from pyflink.table import EnvironmentSettings, TableEnvironment
    from pyflink.version import __version__ as flink_version

    conf = settings(args)
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    for key, value in conf.items():
        env.get_config().set(key, value)
    monitor = args.monitor_seconds if args.mode == "live" else None
    if args.no_join:
        ddl, inserts = floor_statements(args.logs, table, args.watermark_seconds, monitor)
    else:
        ddl, insert = statements(args.logs, table, args.watermark_seconds, args.join_window_seconds, monitor)
        inserts = [insert]
    for statement in ddl:
        env.execute_sql(statement)
    session_start = time.monotonic() - STARTED
    log = LogFollower(args.out / "flink-log")
    deadline = time.monotonic() + args.timeout_seconds

    started = time.monotonic()
    if len(inserts) == 1:
        result = env.execute_sql(inserts[0])
    else:
        statement_set = env.create_statement_set()
        for insert in inserts:
            statement_set.add_insert_sql(insert)
        result = statement_set.execute()
    stop = None
    if args.mode == "backlog":
        result.wait(int(args.timeout_seconds * 1000))
    else:
        client = result.get_job_client()
        try:
            stop = wait_until_all_committed(log, args.logs, table, args.shipping_done, deadline)
        finally:
            client.cancel().result()
    wall = time.monotonic() - started
    jvm_peak = jvm_peak_rss_bytes()
    checkpoints = checkpoint_stats(log)

    output = {
        "peer": "flink" if args.mode == "backlog" else "flink_live",
        "flink_version": flink_version,
        "settings": {
            "runtime_mode": "streaming",
            "sources": "filesystem, json, json.ignore-parse-errors"
                       + (f", source.monitor-interval {args.monitor_seconds} s" if args.mode == "live" else
                          ", bounded"),
            "watermark_seconds": args.watermark_seconds,
            "join_window_seconds": args.join_window_seconds,
            "dedup": "ROW_NUMBER() over click_id by processing time, first row"
                     + (f", state TTL {args.dedup_ttl_seconds:g} s" if args.dedup_ttl_seconds else ", no TTL"),
            "sink": "filesystem, parquet, committed on checkpoint",
            "jvm_heap": args.heap,
            "jvm_options": args.jvm_options,
            "no_join": args.no_join,
            **conf,
        },
        "session_start_seconds": round(session_start, 3),
        "wall_seconds": round(wall, 3),
        "checkpoints": checkpoints,
        "live_stop": stop,
        "jvm_peak_rss_bytes": jvm_peak,
        "table": str(table),
    }
    if args.input_counts:
        output["input"] = input_counts(args.logs)
    print(json.dumps(output, sort_keys=True))


if __name__ == "__main__":
    sys.exit(main())
