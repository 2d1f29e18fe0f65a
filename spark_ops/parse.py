"""Parse a work unit's byte ranges of log files into events and quarantined lines, in Spark.

A range is `[start, end)` of one file, starting at a line start and ending just after a `\\n` (the
dispatcher never hands out a torn line). Ranges are cut into chunks of `chunk_bytes` that executors
read in parallel; a chunk owns the lines that *start* inside it, as Hadoop's line reader does, so
the cut need not fall on a line boundary. Executors yield Arrow record batches (mapInArrow); the
driver never sees the lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_ops.events import PARSERS, BadLine
from spark_ops.schemas import PARSED, arrow_schema

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


def parse_chunks(stream: str, max_line_bytes: int, schema: pa.Schema):
    """mapInArrow function: chunks to parsed lines. A chunk with a `wanted` list yields only the
    lines that may be the events of those ids, and parses only those."""
    parse = PARSERS[stream]
    no_event = (None,) * (len(schema) - 5)  # file, offset, length, reason, snippet follow the event

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows: list[tuple] = []

        def flush() -> pa.RecordBatch:
            columns = zip(*rows)
            batch = pa.RecordBatch.from_arrays(
                [pa.array(col, type=field.type) for col, field in zip(columns, schema)], schema=schema
            )
            rows.clear()
            return batch

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
                        rows.append((*parse(line, max_line_bytes), file, offset, length, None, None))
                    except BadLine as bad:
                        snippet = line[:SNIPPET_CHARS].decode("utf-8", errors="replace")
                        rows.append((*no_event, file, offset, length, str(bad), snippet))
                    if len(rows) >= ROWS_PER_BATCH:
                        yield flush()
        if rows:
            yield flush()

    return run


def chunk_frame(spark: SparkSession, stream_dir: Path, ranges: list[ByteRange], chunk_bytes: int) -> DataFrame:
    """The ranges' chunks (CHUNK_FIELDS), one row each, spread over the session's partitions. Built
    from a few literals per range (no RDD, so it runs over Spark Connect too; no shuffle)."""
    counts = [-(-(r.end - r.start) // chunk_bytes) for r in ranges]
    firsts = [sum(counts[:i]) for i in range(len(ranges))]  # index of each range's first chunk

    def of_range(values: list, kind: str) -> Column:
        """The value of the chunk's range, from one literal array per field."""
        return F.element_at(F.array(*[F.lit(v).cast(kind) for v in values]), which)

    chunk = F.col("id")
    # The range a chunk belongs to: the last one whose first chunk is at or before it (1-based).
    which = F.size(F.filter(F.array(*[F.lit(f).cast("long") for f in firsts]), lambda first: first <= chunk))
    file = of_range([r.file for r in ranges], "string")
    range_start = of_range([r.start for r in ranges], "long")
    range_end = of_range([r.end for r in ranges], "long")
    start = range_start + (chunk - of_range(firsts, "long")) * chunk_bytes
    # Several chunks per task: a Python task costs far more than reading a few MB.
    partitions = max(1, min(sum(counts), int(spark.conf.get("spark.sql.shuffle.partitions"))))
    return spark.range(0, sum(counts), 1, partitions).select(
        F.concat(F.lit(str(stream_dir) + "/"), file).alias("path"),
        file.alias("file"),
        range_end.alias("range_end"),
        start.alias("chunk_start"),
        F.least(start + chunk_bytes, range_end).alias("chunk_end"),
        (start == range_start).alias("owns_first_line"),
    )


def parse_ranges(
    spark: SparkSession,
    stream: str,
    stream_dir: Path,
    ranges: list[ByteRange],
    max_line_bytes: int = 65536,
    chunk_bytes: int = 4 << 20,
) -> DataFrame:
    """Every line of the ranges, parsed: events have `reason` null, quarantined lines have one."""
    spark_schema = PARSED[stream]
    ranges = [r for r in ranges if r.end > r.start]
    if not ranges:
        return spark.createDataFrame([], spark_schema)
    return chunk_frame(spark, stream_dir, ranges, chunk_bytes).mapInArrow(
        parse_chunks(stream, max_line_bytes, arrow_schema(spark_schema)), spark_schema
    )


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
