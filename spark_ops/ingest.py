"""Turning a work unit's log lines into the EventStore's tiers (the memory tier, query_logs and
log_file_map), the click ledger, and quarantine.

A unit's lines are parsed by one Spark job, into the unit's staging directory (`stage_lines`); query
lines reach the memory tier from the same tasks that parse them. A unit of at most one parse chunk
(a live click unit) is parsed in the driver instead, by the same function. Everything else reads
the staged lines: the tables' appends in Spark, and the unit's counts, event-time sketch and log file map
entries in the driver, from a few columns with pyarrow (a few rows per writer come out of them: no
Spark job for a count). Each row appended carries its work unit, so a retried work unit that had
already committed a table appends nothing more to it (spark_ops/tables.py: append_once).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from resources.event_store.tail_segments import TailSegments
from resources.state.layout import DataLayout
from resources.state.sidecars import EventTimeWatermark
from resources.state.watermark import SKETCH_FRACTIONS, WatermarkRule
from spark_ops.handoff import materialize, unstage
from spark_ops.parse import (
    CHUNK_BYTES,
    TEXT_FIELDS,
    ByteRange,
    events,
    parse_in_driver,
    parse_ranges,
    quarantined,
)
from spark_ops.registry_calls import QueryPut
from spark_ops.schemas import CLICK_FIELDS, PARSED, SOURCE_FIELDS, with_run_values
from spark_ops.tables import append_once, read_table

if TYPE_CHECKING:  # for the annotation only: the settings are a Dagster resource, and spark_ops runs without Dagster
    from resources.settings import PipelineSettings

MAP_KEYS = ["file", "server_ip", "process_id"]


@dataclass
class IngestStats:
    lines: int = 0
    events: int = 0
    quarantined: int = 0
    future_events: int = 0  # valid, but from the future: they move no timestamp (spark_ops/validity.py)
    bytes_read: int = 0
    max_timestamp_us: int | None = None
    # For the stream's watermark (resources/state/watermark.py): the sketch of the event times not from the
    # future, and how many of those are at or after the watermark the pass read first.
    sketch: list[int] | None = None
    at_or_after_watermark: int = 0
    # Per query writer (`server_ip:process_id`) in these lines: its oldest and newest timestamp.
    writers: dict[str, tuple[int, int]] = field(default_factory=dict)
    parsed_by_the_tailer: bool = False  # staged from the query tailer's segments (stage_queries)
    bytes_finished_elsewhere: int = 0  # a retried click unit's bytes another datacenter finished: not parsed


def stage_lines(spark: SparkSession, stream: str, stream_dir: Path, ranges: list[ByteRange], max_line_bytes: int,
                path: Path, text_sink=None) -> DataFrame:
    """The ranges' lines parsed once (spark_ops/parse.py), into Parquet at `path`, read back. Up to
    one parse chunk (CHUNK_BYTES, which Spark too would read in a task or two) and with no text sink
    (whose puts are keyed by the task), parsed in the driver: the Spark job that would parse a live
    click unit costs ~0.45 s more than the parse (benchmarks/README.md, issue 42's nineteenth
    round), a tenth of a click run."""
    if text_sink is None and sum(r.end - r.start for r in ranges) <= CHUNK_BYTES:
        parsed = parse_in_driver(stream, stream_dir, ranges, max_line_bytes)
        return unstage(spark, pa.RecordBatchReader.from_batches(parsed.schema, parsed.to_batches()), path,
                       PARSED[stream])
    return materialize(parse_ranges(spark, stream, stream_dir, ranges, max_line_bytes, text_sink=text_sink), path)


def _staged(path: Path, columns: list[str], valid_only: bool = False) -> pa.Table:
    dataset = ds.dataset(str(path), format="parquet")
    return dataset.to_table(columns=columns, filter=ds.field("reason").is_null() if valid_only else None)


def stage_queries(spark: SparkSession, stream_dir: Path, ranges: list[ByteRange], max_line_bytes: int, put: QueryPut,
                  path: Path, segments: TailSegments | None = None) -> tuple[DataFrame, bool]:
    """A query work unit's lines, staged, and whether the query tailer had parsed them. While a tailer
    feeds the memory tier, its segments (resources/event_store/tail_segments.py) that cover the unit's
    ranges are its staged lines: no Spark job, no line parsed twice. Otherwise the lines are parsed;
    the valid ones held by the memory tier, by the tasks that parse them, and staged without their
    text (or, for a registry in the driver's process, put from the staged lines)."""
    if put.tailed and segments is not None:
        pieces = segments.covering([(r.file, r.start, r.end) for r in ranges])
        if pieces and segments.stage(pieces, path):
            return spark.read.schema(PARSED["query"]).parquet(str(path)), True
    sink = put.in_executors()
    parsed = stage_lines(spark, "query", stream_dir, ranges, max_line_bytes, path, sink)
    if sink is None:
        put.from_driver(_staged(path, TEXT_FIELDS, valid_only=True))
    return parsed, False


def line_stats(path: Path, by_writer: bool = False, latest_valid_us: int | None = None,
               watermark_us: int | None = None) -> IngestStats:
    """Counts of a work unit's staged lines and the sketch of their event times; with `by_writer`
    (query lines) also each writer's oldest and newest timestamp. Events after `latest_valid_us`
    (from the future: spark_ops/validity.py) are counted but move no timestamp."""
    table = _staged(path, ["reason", "timestamp_us", "length", *(["server_ip", "process_id"] if by_writer else [])])
    is_event = pc.is_null(table["reason"])
    times = table["timestamp_us"]
    in_time = is_event if latest_valid_us is None else pc.and_kleene(is_event, pc.less_equal(times, latest_valid_us))
    in_time = pc.fill_null(in_time, False)
    valid = table.filter(in_time)
    ts = valid["timestamp_us"].to_numpy()
    events = pc.sum(is_event.cast(pa.int64())).as_py() or 0
    writers = {}
    if by_writer and valid.num_rows:
        per_writer = valid.group_by(["server_ip", "process_id"]).aggregate(
            [("timestamp_us", "min"), ("timestamp_us", "max")])
        writers = {f"{ip}:{pid}": (low, high) for ip, pid, low, high in zip(*[
            per_writer[c].to_pylist() for c in ("server_ip", "process_id", "timestamp_us_min", "timestamp_us_max")])}
    return IngestStats(
        lines=table.num_rows,
        events=events,
        quarantined=table.num_rows - events,
        future_events=events - valid.num_rows,
        bytes_read=pc.sum(table["length"]).as_py() or 0,
        max_timestamp_us=int(ts.max()) if len(ts) else None,
        sketch=[int(v) for v in np.quantile(ts, SKETCH_FRACTIONS, method="lower")] if len(ts) else None,
        at_or_after_watermark=int(len(ts) if watermark_us is None else (ts >= watermark_us).sum()),
        writers=writers,
    )


def pass_watermark(inputs: PassInputs, stream: str, stats: IngestStats) -> EventTimeWatermark:
    """After the pass's writes: its events (none from the future) move the stream's watermark."""
    return EventTimeWatermark.add_pass(
        inputs.layout.watermark_file(inputs.dc, stream), inputs.work_unit, stats.events - stats.future_events,
        stats.sketch, stats.at_or_after_watermark, WatermarkRule.of(inputs.settings),
    )


def log_file_map_entries(path: Path, every_seconds: float, every_bytes: int) -> pa.Table:
    """Photon's sparse index into the raw query logs (§3.4.2), from a unit's staged query lines: per
    file, the first query of every `every_seconds` window of event time and of every `every_bytes`
    span of the file, so a lookup finds an entry within W seconds or M bytes before any query.
    Columns: file, server_ip, process_id, timestamp_us, offset."""
    table = _staged(path, [*MAP_KEYS, "timestamp_us", "offset"], valid_only=True)
    table = table.sort_by([("file", "ascending"), ("offset", "ascending")])
    window_us = int(every_seconds * 1_000_000)
    firsts = []
    for name, values in (("window", np.floor_divide(table["timestamp_us"].to_numpy(), window_us)),
                         ("span", np.floor_divide(table["offset"].to_numpy(), every_bytes))):
        # In file order, the first row of each group is its smallest offset.
        first = table.append_column(name, pa.array(values)).group_by([*MAP_KEYS, name], use_threads=False).aggregate(
            [("offset", "first"), ("timestamp_us", "first")])
        firsts.append(first.select([*MAP_KEYS, "timestamp_us_first", "offset_first"])
                      .rename_columns([*MAP_KEYS, "timestamp_us", "offset"]))
    both = pa.concat_tables(firsts)
    return both.group_by(both.column_names, use_threads=False).aggregate([])  # distinct


@dataclass(frozen=True)
class UnitOutput:
    """Where a work unit's rows go: its datacenter, id and attempt (appends are once per unit:
    spark_ops/tables.py, append_once) and the tables' paths."""

    dc: str
    work_unit: str
    attempt: int
    tables: dict[str, str]

    def with_unit(self, df: DataFrame) -> DataFrame:
        return df.withColumn("dc", F.lit(self.dc)).withColumn("work_unit", F.lit(self.work_unit))

    def append(self, df: DataFrame, table: str) -> None:
        append_once(df, table, self.tables[table], self.work_unit, self.attempt)


@dataclass(frozen=True)
class PassInputs:
    """What a run's pass over its work unit is given (spark_ops/click_pass.py, spark_ops/query_pass.py),
    built by its asset from the run config (photon_assets/work_unit.py: WorkUnitConfig.pass_inputs):
    the unit (its datacenter, id, attempt, byte ranges and clock), whether it is a click unit of no log
    bytes that retries its datacenter's pending clicks (`pending_only`), where it reads and writes
    (the attempt's staging directory among them), and the pipeline's settings."""

    dc: str
    work_unit: str  # a click unit's registry token too: every attempt gets its own ids back
    attempt: int
    ranges: list[ByteRange]
    clock_us: int  # the pipeline's clock for the unit: the same in every attempt (spark_ops/validity.py)
    layout: DataLayout
    tables: dict[str, str]
    staging: Path
    settings: PipelineSettings
    pending_only: bool = False


def ingest_queries(parsed: DataFrame, path: Path, stats: IngestStats, unit: UnitOutput, map_every_seconds: float,
                   map_every_bytes: int, cache_since_us: int | None = None) -> int:
    """A query unit's staged lines (`stage_queries`, at `path`) appended to the durable tier and the
    log file map. Queries older than `cache_since_us` skip the durable tier (query_logs): the log file
    map, which indexes every query, finds them. Returns the log file map entries added."""
    queries = unit.with_unit(events(parsed))
    # The boundary as a run value: a literal would make each run's append compile its code anew.
    cached = queries if cache_since_us is None else (
        with_run_values(queries, cache_since_us=cache_since_us)
        .where(F.col("timestamp_us") >= F.col("cache_since_us")).drop("cache_since_us"))
    unit.append(cached, "query_logs")
    entries = log_file_map_entries(path, map_every_seconds, map_every_bytes)
    if entries.num_rows:
        staged = unstage(parsed.sparkSession, pa.RecordBatchReader.from_batches(entries.schema, entries.to_batches()),
                         path.parent / "log_file_map")
        unit.append(unit.with_unit(staged), "log_file_map")
    _quarantine(parsed, stats, "query", unit)
    return entries.num_rows


def record_clicks(parsed: DataFrame, stats: IngestStats, unit: UnitOutput) -> None:
    """Records a click work unit's staged lines in the ledger, and its bad ones (`stats` counts them:
    line_stats) in quarantine. The ledger gets one file a unit: an append of a file per staged part (3-4
    a unit) brought the ledger to a compaction every ~4 minutes at 1,000 clicks/s, each holding the
    table's lock for 7-12 s (a live `photon run` of 2026-11-28). One task writes a live unit's 10-30k
    rows beside the join: the join's wait for it before the registry commit stayed 0.3-1.8 s."""
    unit.append(unit.with_unit(events(parsed)).coalesce(1), "click_ledger")
    _quarantine(parsed, stats, "click", unit)


def ledger_clicks(spark: SparkSession, path: str, work_unit: str, ranges: list[ByteRange]) -> DataFrame | None:
    """The clicks a work unit's earlier attempt recorded in the ledger within `ranges` (None: no
    range), as its parse staged them (`events`). A retry looks these up instead of parsing the
    ranges another datacenter finished: they hold every id the unit may have registered, since a unit
    commits its ledger rows before any registry commit (spark_ops/join.py). None recorded: the unit
    registered nothing, and the other datacenter resolved every click there."""
    if not ranges:
        return None
    within = None
    for r in ranges:
        piece = (F.col("file") == r.file) & (F.col("offset") >= r.start) & (F.col("offset") < r.end)
        within = piece if within is None else within | piece
    ledger = read_table(spark, "click_ledger", path).where((F.col("work_unit") == work_unit) & within)
    return ledger.select(*[f.name for f in CLICK_FIELDS + SOURCE_FIELDS])


def _quarantine(parsed: DataFrame, stats: IngestStats, stream: str, unit: UnitOutput) -> None:
    # Most work units have no bad line, and an empty Delta commit still costs a second.
    if stats.quarantined:
        unit.append(quarantined(parsed, unit.dc, stream, unit.work_unit), "quarantined_lines")
