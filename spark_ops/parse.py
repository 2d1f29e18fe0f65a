"""Parse a work unit's byte ranges of log files into events and quarantined lines, in Spark.

A range is `[start, end)` of one file, starting at a line start and ending just after a `\\n` (the
dispatcher never hands out a torn line). Ranges are cut into chunks of `chunk_bytes` that executors
read in parallel; a chunk owns the lines that *start* inside it, as Hadoop's line reader does, so
the cut need not fall on a line boundary. Executors yield Arrow record batches (mapInArrow); the
driver never sees the lines, except those of a unit no larger than one chunk (`parse_in_driver`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_ops.events import BadLine, parse_click, parse_query, query_key
from spark_ops.schemas import PARSED, QUERY_STRUCT, arrow_schema

QUERY_ARROW = arrow_schema(QUERY_STRUCT)

CHUNK_FIELDS = T.StructType(
    [
        T.StructField("path", T.StringType()),
        T.StructField("file", T.StringType()),
        T.StructField("range_end", T.LongType()),
        T.StructField("chunk_start", T.LongType()),
        T.StructField("chunk_end", T.LongType()),
        T.StructField("owns_first_line", T.BooleanType()),
    ]
)
# A chunk of a lookup also names the query ids it is read for (the EventStore's logs tier).
LOOKUP_CHUNK_FIELDS = T.StructType(
    CHUNK_FIELDS.fields + [T.StructField("wanted", T.ArrayType(T.StringType()))]
)
ROWS_PER_BATCH = 8192
# Bytes of a log file a parse task reads as one chunk.
CHUNK_BYTES = 4 << 20
# What a query line's text goes with to a text sink (parse_chunks): the memory tier's piece
# (resources/event_store/memory_tier.py: PIECE_SCHEMA).
TEXT_FIELDS = ["query_id", "timestamp_us", "line", "file", "offset", "length"]
SNIPPET_CHARS = 200


@dataclass(frozen=True)
class ByteRange:
    file: str  # relative to the datacenter's stream directory
    start: int
    end: int


def _read_line(f, limit: int) -> tuple[bytes, int]:
    """The next line without its `\\n` (truncated past `limit` bytes) and its full length with it."""
    line = f.readline(limit + 1)
    if line.endswith(b"\n"):
        return line[:-1], len(line)
    length = len(line)
    # Longer than the limit: skip the rest of it without holding it in memory.
    while True:
        block = f.readline(1 << 20)
        length += len(block)
        if not block or block.endswith(b"\n"):
            return line, length


def _chunk_lines(chunk: dict, max_line_bytes: int) -> Iterator[tuple[int, bytes, int]]:
    """(offset, line, length) of each line starting in the chunk."""
    with open(chunk["path"], "rb") as f:
        pos = chunk["chunk_start"]
        if not chunk["owns_first_line"]:
            # The line containing byte chunk_start - 1 belongs to the previous chunk.
            f.seek(pos - 1)
            _, skipped = _read_line(f, max_line_bytes)
            pos += skipped - 1
        else:
            f.seek(pos)
        while pos < chunk["chunk_end"] and pos < chunk["range_end"]:
            line, length = _read_line(f, max_line_bytes)
            if length == 0:
                return
            yield pos, line, length
            pos += length


def _may_hold(line: bytes, ids: list[bytes]) -> bool:
    """Whether a line may be the event of one of `ids`: its id appears in it literally, or escaped
    (JSON allows escaping any character of a string, and an escape needs a backslash)."""
    return b"\\" in line or any(i in line for i in ids)


# What a parsed line keeps of its event. A query line keeps its key fields and the line itself (the
# EventStore parses the rest of the few queries clicks need: with_query_struct); a click line keeps
# every field.
PARSERS = {"query": query_key, "click": parse_click}


def parse_chunks(stream: str, max_line_bytes: int, schema: pa.Schema,
                 text_sink: Callable[[pa.Table], None] | None = None):
    """mapInArrow function: chunks to parsed lines. A chunk with a `wanted` list yields only the
    lines that may be the events of those ids, and parses only those. Columns are gathered as lists
    and turned into Arrow once per batch: no Python object per row beyond the parse itself.
    `text_sink` (query lines) is given the task's valid lines (TEXT_FIELDS) once they are all
    parsed, before the task ends (a retried task gives it the same lines again), and the rows yielded
    then hold no text (`line` null): the text is most of a query line's bytes, and what follows an
    ingest needs only where the line lies."""
    parse = PARSERS[stream]
    n_event = len(schema) - 5  # file, offset, length, reason, snippet follow the event
    no_event = (None,) * n_event

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        columns: list[list] = [[] for _ in schema]
        event_columns, source_columns = columns[:n_event], columns[n_event:]
        valid: list[pa.RecordBatch] | None = None if text_sink is None else []
        for batch in batches:
            for chunk in batch.to_pylist():
                file = chunk["file"]
                wanted = [w.encode() for w in chunk["wanted"]] if "wanted" in chunk else None
                for offset, line, length in _chunk_lines(chunk, max_line_bytes):
                    if wanted is not None and not _may_hold(line, wanted):
                        continue
                    try:
                        if length - 1 > max_line_bytes:  # `line` holds only its first bytes
                            raise BadLine(f"line of {length - 1} bytes exceeds the limit of {max_line_bytes}")
                        values, problem = parse(line, max_line_bytes), (None, None)
                    except BadLine as bad:
                        values, problem = no_event, (str(bad), line[:SNIPPET_CHARS].decode("utf-8", errors="replace"))
                    for col, value in zip(event_columns, values):
                        col.append(value)
                    for col, value in zip(source_columns, (file, offset, length, *problem)):
                        col.append(value)
                    if len(columns[0]) >= ROWS_PER_BATCH:
                        yield _batch_of(columns, schema, valid)
        if columns[0]:
            yield _batch_of(columns, schema, valid)
        if text_sink is not None:
            text_sink(pa.Table.from_batches(valid, schema=pa.schema([schema.field(name) for name in TEXT_FIELDS])))

    return run


def _batch_of(columns: list[list], schema: pa.Schema, valid: list[pa.RecordBatch] | None) -> pa.RecordBatch:
    """The lines gathered in `columns` as one record batch, the columns emptied for the next. With
    `valid` (a text sink's), the valid lines' text goes there and the batch keeps none of it."""
    batch = pa.RecordBatch.from_arrays([pa.array(col, type=field.type) for col, field in zip(columns, schema)],
                                       schema=schema)
    for col in columns:
        col.clear()
    if valid is not None:
        valid.append(batch.filter(pc.is_null(batch.column("reason"))).select(TEXT_FIELDS))
        batch = batch.set_column(schema.get_field_index("line"), "line", pa.nulls(batch.num_rows, pa.string()))
    return batch


def query_struct_column(lines: list[str | None]) -> pa.StructArray:
    """The query events (QUERY_STRUCT) of lines the contract accepted at ingest, built column by
    column (nested Arrow from Python dicts costs twice the parse); null where the line is null."""
    ids, times, texts, extras, ad_offsets = [], [], [], [], [0]
    ad_ids, advertisers, positions, bids = [], [], [], []
    valid = []
    for line in lines:
        if line is None:
            event = ("", 0, "", [], None)
            valid.append(False)
        else:
            event = parse_query(line.encode(), len(line.encode()))
            valid.append(True)
        ids.append(event[0])
        times.append(event[1])
        texts.append(event[2])
        extras.append(event[4])
        for ad in event[3]:
            ad_ids.append(ad["ad_id"])
            advertisers.append(ad["advertiser_id"])
            positions.append(ad["position"])
            bids.append(ad["bid_micros"])
        ad_offsets.append(len(ad_ids))
    ads = pa.ListArray.from_arrays(
        pa.array(ad_offsets, pa.int32()),
        pa.StructArray.from_arrays(
            [pa.array(ad_ids, pa.string()), pa.array(advertisers, pa.string()), pa.array(positions, pa.int64()),
             pa.array(bids, pa.int64())],
            fields=list(QUERY_ARROW.field("ads").type.value_type),
        ),
    )
    return pa.StructArray.from_arrays(
        [pa.array(ids, pa.string()), pa.array(times, pa.int64()), pa.array(texts, pa.string()), ads,
         pa.array(extras, pa.string())],
        fields=list(QUERY_ARROW),
        mask=pa.array([not v for v in valid], pa.bool_()),
    )


def with_query_struct(df: DataFrame, line: str = "line") -> DataFrame:
    """`df` with its query line column replaced by the parsed query event, `query` (QUERY_STRUCT),
    in executors. Only for lines the contract accepted when their query was ingested."""
    others = [f for f in df.schema.fields if f.name != line]
    out = T.StructType(others + [T.StructField("query", QUERY_STRUCT)])
    names = [f.name for f in others]
    out_arrow = arrow_schema(out)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            struct = query_struct_column(batch.column(line).to_pylist())
            yield pa.RecordBatch.from_arrays([batch.column(n) for n in names] + [struct], schema=out_arrow)

    return df.mapInArrow(run, out)


def chunk_table(stream_dir: Path, ranges: list[ByteRange], chunk_bytes: int) -> pa.Table:
    """The ranges' chunks (CHUNK_FIELDS), one row each."""
    rows = {name: [] for name in CHUNK_FIELDS.fieldNames()}
    for r in ranges:
        for start in range(r.start, r.end, chunk_bytes):
            for name, value in zip(rows, (f"{stream_dir}/{r.file}", r.file, r.end, start, min(start + chunk_bytes, r.end),
                                          start == r.start)):
                rows[name].append(value)
    return pa.table(rows, schema=arrow_schema(CHUNK_FIELDS))


def chunk_frame(spark: SparkSession, stream_dir: Path, ranges: list[ByteRange], chunk_bytes: int) -> DataFrame:
    """The ranges' chunks (`chunk_table`) spread over the session's partitions (a Python task costs
    far more than reading a few MB, so each takes several). Built in the driver as one small Arrow
    table, a record batch per partition, which both a local session and a Connect client turn into a
    frame without a Python worker or a shuffle. (Literal arrays chosen per row by an expression, the
    former way, cost ~3 s of code generation for 200 ranges.)"""
    table = chunk_table(stream_dir, ranges, chunk_bytes)
    partitions = max(1, min(table.num_rows, int(spark.conf.get("spark.sql.shuffle.partitions"))))
    batches = table.to_batches(max_chunksize=-(-table.num_rows // partitions))
    return spark.createDataFrame(pa.Table.from_batches(batches, schema=table.schema), schema=CHUNK_FIELDS)


def parse_ranges(
    spark: SparkSession,
    stream: str,
    stream_dir: Path,
    ranges: list[ByteRange],
    max_line_bytes: int = 65536,
    chunk_bytes: int = CHUNK_BYTES,
    text_sink: Callable[[pa.Table], None] | None = None,
) -> DataFrame:
    """Every line of the ranges, parsed: events have `reason` null, quarantined lines have one.
    `text_sink`: see parse_chunks."""
    spark_schema = PARSED[stream]
    ranges = [r for r in ranges if r.end > r.start]
    if not ranges:
        return spark.createDataFrame([], spark_schema)
    return chunk_frame(spark, stream_dir, ranges, chunk_bytes).mapInArrow(
        parse_chunks(stream, max_line_bytes, arrow_schema(spark_schema), text_sink), spark_schema
    )


def parse_in_driver(stream: str, stream_dir: Path, ranges: list[ByteRange], max_line_bytes: int = 65536,
                    chunk_bytes: int = CHUNK_BYTES, text_sink: Callable[[pa.Table], None] | None = None) -> pa.Table:
    """What `parse_ranges` yields for the ranges (PARSED[stream] as Arrow), parsed in this process by
    the same function its tasks run; `text_sink` as there. For a live click unit (~1.5 MB) this is
    ~0.13 s against ~0.58 s for the Spark job that would parse it in one or two tasks
    (spark_ops/ingest.py: stage_lines); the query tailer parses its puts so (photon/query_tail.py)."""
    schema = arrow_schema(PARSED[stream])
    chunks = chunk_table(stream_dir, [r for r in ranges if r.end > r.start], chunk_bytes)
    batches = list(parse_chunks(stream, max_line_bytes, schema, text_sink)(iter(chunks.to_batches())))
    return pa.Table.from_batches(batches, schema=schema)


def events(parsed: DataFrame) -> DataFrame:
    return parsed.where(F.col("reason").isNull()).drop("reason", "snippet")


def quarantined(parsed: DataFrame, dc: str, stream: str, work_unit: str) -> DataFrame:
    return parsed.where(F.col("reason").isNotNull()).select(
        F.lit(dc).alias("dc"),
        F.lit(stream).alias("stream"),
        "file",
        "offset",
        "length",
        "reason",
        "snippet",
        F.lit(work_unit).alias("work_unit"),
    )
