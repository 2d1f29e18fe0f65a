"""Calls to the registry service for a DataFrame's rows, as Arrow batches: id lookups and commits,
the per-query click cap, and the EventStore's memory tier (resources/event_store/memory_tier.py).

With the registry service, each Spark task sends its partition to the server itself (no round trip
through the driver); a task retried by Spark repeats its call, which the service answers the same
way (a commit under the same token, a put of the same piece). An embedded registry lives in the
driver's process, so its batches are handed over as Parquet (spark_ops/handoff.py). Either way an
answer is read back from Parquet in the staging directory: it is computed once, whatever number of
actions read it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from resources.event_store.memory_tier import Holding, read_located
from resources.registry.api import IdRegistry
from spark_ops.query_tiers import EventStore, writers_of
from spark_ops.handoff import materialize, stage, unstage
from spark_ops.schemas import arrow_schema

COMMIT_ANSWER = T.StructType([T.StructField("click_id", T.StringType()), T.StructField("status", T.StringType())])
GRANT_ANSWER = T.StructType([T.StructField("query_id", T.StringType()), T.StructField("granted", T.LongType())])
# What a click lookup adds to each click: its registry entry, if any, and its query's line if the
# memory tier holds it.
LOOKUP_FIELDS = [
    T.StructField("registry_status", T.StringType()),  # registered, too_old, or null: unregistered
    T.StructField("registry_token", T.StringType()),
    T.StructField("query_timestamp_us", T.LongType()),
    T.StructField("line", T.StringType()),
    # The memory tier's horizon when the task had looked its clicks up (resources/event_store/memory_tier.py).
    T.StructField("memory_horizon_ts", T.LongType()),
    # Once a query tailer feeds the memory tier: the newest time of the query's writer it had put
    # before the lookup (-1: none of that writer yet); null while query runs feed it.
    T.StructField("query_fed_ts", T.LongType()),
    # The query's writer (`<server_ip>:<process_id>`; null if the id is not of that form) and its
    # ingested progress, as the run read it (spark_ops/pending.py: PROGRESS_SCHEMA); null for a writer
    # not ingested yet.
    T.StructField("query_writer", T.StringType()),
    T.StructField("writer_ts", T.LongType()),
    T.StructField("writer_backfills", T.IntegerType()),
]


def fed_times(query_ids: pa.Array, tail: dict | None) -> pa.Array:
    """Per query id, the newest query time of its writer (`<server_ip>:<process_id>`, the id's
    prefix) the tailer had put (`tail_state`'s "writers"), -1 for a writer it has not seen; all null
    when no tailer feeds the memory tier (tail None)."""
    if tail is None:
        return pa.nulls(len(query_ids), pa.int64())
    writers = writers_of(query_ids)
    names = pa.array(list(tail["writers"]), pa.string())
    times = pa.array(list(tail["writers"].values()), pa.int64())
    return pc.fill_null(pc.take(times, pc.index_in(writers, value_set=names)), -1)


def with_columns_of(table: pa.Table, other: pa.Table, key: str) -> pa.Table:
    """`table` with `other`'s columns (but `key`) of the row whose `key` matches, null where none
    does; `other` holds each key once. (Arrow's own join warns on the buffers Flight delivers.)"""
    index = pc.index_in(table.column(key), value_set=other.column(key))
    for name in other.column_names:
        if name != key:
            table = table.append_column(name, pc.take(other.column(name), index))
    return table


def _answer_of(partition_call: Callable[[pa.Table], pa.Table], schema: T.StructType):
    """mapInArrow function: the whole partition to `partition_call`, its answer cast to `schema`."""
    target = arrow_schema(schema)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        batches = [b for b in batches if b.num_rows]
        if batches:
            yield from partition_call(pa.Table.from_batches(batches)).select(target.names).cast(target).to_batches()

    return run


def _via_driver(spark: SparkSession, df: DataFrame, call: Callable[[pa.Table], pa.Table], schema: T.StructType,
                staging: Path) -> DataFrame:
    """The embedded registry: the frame staged as Parquet, called in the driver, the answer unstaged."""
    answer = call(stage(df, staging / "input").to_table()).select(schema.fieldNames())
    answer = answer.cast(arrow_schema(schema))
    return unstage(spark, pa.RecordBatchReader.from_batches(answer.schema, answer.to_batches()), staging / "answer")


def _call(spark: SparkSession, registry: IdRegistry, df: DataFrame, call: Callable[[IdRegistry, pa.Table], pa.Table],
          schema: T.StructType, staging: Path, materialized: bool = True) -> DataFrame:
    remote = registry.for_executors()
    if remote is None:
        return _via_driver(spark, df, lambda table: call(registry, table), schema, staging)
    answer = df.mapInArrow(_answer_of(lambda table: call(remote, table), schema), schema)
    return materialize(answer, staging / "answer") if materialized else answer


def commit_ids(spark: SparkSession, registry: IdRegistry, ids: DataFrame, token: str, staging: Path,
               where: str | None = None) -> DataFrame:
    """`ids`: click_id, timestamp_us and any other columns, one row per click_id. Answer: those
    columns, the status (held, refused, too_old) of each id, and `decided_at_us`, the time (epoch
    microseconds) its task had the registry's answer; with `where` (a boolean column), only the rows
    where it holds are committed, the others pass with status null. Not materialized with the service
    (the caller materializes it with what it derives); with an embedded registry, read from Parquet.

    The time is a column the task writes, not a value of the driver's: a value that changes at every
    run, joined from a one-row frame (spark_ops/schemas.py: with_run_values), cost each write of the
    outputs a broadcast job before its own (0.05-0.6 s in a live click run's event log)."""
    schema = T.StructType([f for f in ids.schema.fields]
                          + [T.StructField("status", T.StringType()), T.StructField("decided_at_us", T.LongType())])

    def commit(registry: IdRegistry, table: pa.Table) -> pa.Table:
        chosen = table if where is None else table.filter(pc.fill_null(table.column(where), False))
        if not chosen.num_rows:
            answered = table.append_column("status", pa.nulls(table.num_rows, pa.string()))
        else:
            answer = registry.commit(chosen.select(["click_id", "timestamp_us"]), token)
            answered = with_columns_of(table, answer.select(["click_id", "status"]), "click_id")
        return answered.append_column("decided_at_us", pa.array([time.time_ns() // 1000] * table.num_rows, pa.int64()))

    return _call(spark, registry, ids, commit, schema, staging, materialized=False)


@dataclass(frozen=True)
class RunColumns:
    """What a click run adds to each click it looks up, in the lookup's own task: `progress`, the query
    stream's progress per writer (query_writer, writer_ts, writer_backfills), matched by the click's
    query writer; and `values`, the run's values, a long column each, the same in every row. Joined
    from one-row frames instead (spark_ops/schemas.py: with_run_values), they cost the lookup three
    broadcast jobs."""

    progress: pa.Table
    values: dict[str, int | None]


def lookup_clicks(spark: SparkSession, registry: IdRegistry, clicks: DataFrame, dc: str, store: EventStore,
                  staging: Path, run: RunColumns) -> DataFrame:
    """`clicks` (one row per click_id, with query_id and timestamp_us) with LOOKUP_FIELDS and `run`'s
    columns added, from one call per partition to the registry's ids (the dispatcher lookup) and to
    the memory tier of `dc`'s EventStore (`store`); the lines of the queries it holds located only are
    read from `store`'s query logs by the same task. Not materialized with the service (the caller
    materializes it once with what it derives); with an embedded registry, the answer is read from
    Parquet."""
    # Taken out of the store: the tasks' function carries these, not the store's frames.
    query_dir, max_line_bytes = store.query_dir, store.max_line_bytes
    values = T.StructType([T.StructField(name, T.LongType()) for name in run.values])
    schema = T.StructType(clicks.schema.fields + LOOKUP_FIELDS + values.fields)

    def lookup(registry: IdRegistry, table: pa.Table) -> pa.Table:
        registered = registry.lookup(table.select(["click_id", "timestamp_us"])).select(["click_id", "token", "status"])
        registered = registered.rename_columns(["click_id", "registry_token", "registry_status"])
        # The tailer's writers' times read before the lines (whatever it had put by then is among
        # them), the horizon after (an eviction meanwhile only raises it, so a miss it vouches for is
        # one): three reads of one memory tier, in one call, answered by the process that holds it.
        tail, recalled, horizon = registry.recall_with_tail(dc, table.select(["query_id"]))
        lines = read_located(recalled, query_dir, max_line_bytes).select(["query_id", "timestamp_us", "line"])
        lines = lines.rename_columns(["query_id", "query_timestamp_us", "line"])
        looked = with_columns_of(with_columns_of(table, registered, "click_id"), lines, "query_id")
        looked = looked.append_column("memory_horizon_ts", pa.array([horizon] * looked.num_rows, pa.int64()))
        query_ids = looked.column("query_id").combine_chunks()
        looked = looked.append_column("query_fed_ts", fed_times(query_ids, tail))
        looked = with_columns_of(looked.append_column("query_writer", writers_of(query_ids)), run.progress, "query_writer")
        for name, value in run.values.items():
            looked = looked.append_column(name, pa.array([value] * looked.num_rows, pa.int64()))
        return looked

    return _call(spark, registry, clicks, lookup, schema, staging, materialized=False)


def _held_by_the_tailer(lines: pa.Table) -> None:
    """A parse task's text sink when the query tailer already put these lines."""


@dataclass(frozen=True)
class QueryPut:
    """One attempt of a query work unit putting its valid lines into `dc`'s memory tier
    (resources/event_store/memory_tier.py): each task that parses a share of them puts that share as a piece
    of its own, keyed by the task's partition (a retried task replaces its piece)."""

    registry: IdRegistry
    dc: str
    unit: str
    attempt: int
    ingested_before_ts: int | None  # the query stream's progress before this unit
    holding: Holding  # how the memory tier holds the lines (its limits, what is from the future)
    # A query tailer feeds `dc`'s memory tier (photon/query_tail.py): the run puts nothing, and its
    # parse tasks still drop the lines' text from what they stage.
    tailed: bool = False

    def _args(self) -> tuple:
        return (self.dc, self.unit, self.attempt)

    def in_executors(self) -> Callable[[pa.Table], None] | None:
        """The function a parse task gives its valid lines (spark_ops/parse.py: text_sink); None if
        the registry lives in the driver's process only."""
        if self.tailed:
            return _held_by_the_tailer
        remote = self.registry.for_executors()
        if remote is None:
            return None
        dc, unit, attempt = self._args()
        rest = (self.ingested_before_ts, self.holding)

        def put(lines: pa.Table) -> None:
            from pyspark import TaskContext

            remote.remember_queries(dc, unit, attempt, TaskContext.get().partitionId(),
                                    lines, *rest)

        return put

    def from_driver(self, lines: pa.Table) -> None:
        """All the unit's valid lines (query_id, timestamp_us, line), as one piece."""
        if self.tailed:
            return
        self.registry.remember_queries(*self._args(), 0, lines, self.ingested_before_ts, self.holding)


def grant_clicks(spark: SparkSession, registry: IdRegistry, wanted: DataFrame, token: str, cap: int,
                 staging: Path) -> DataFrame:
    """`wanted`: query_id, wanted, one row per query. Answer: query_id, granted (the per-query click
    cap: resources/registry/click_caps.py)."""
    return _call(spark, registry, wanted, lambda registry, table: registry.grant_clicks(table, token, cap),
                 GRANT_ANSWER, staging)

