"""Registry lookups and commits for a DataFrame of ids, as Arrow batches.

With the registry service, each Spark task sends its partition's ids to the server itself (no round
trip through the driver); a task retried by Spark repeats its commit under the same token, which the
registry answers the same way. An embedded registry lives in the driver's process, so its batches
are handed over as Parquet (spark_ops/handoff.py). Either way the answer is read back from Parquet in
the staging directory: it is computed once, whatever number of actions read it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from resources.registry import IdRegistry
from spark_ops.handoff import materialize, stage, unstage

LOOKUP_ANSWER = T.StructType(
    [
        T.StructField("click_id", T.StringType()),
        T.StructField("token", T.StringType()),
        T.StructField("status", T.StringType()),
    ]
)
COMMIT_ANSWER = T.StructType([T.StructField("click_id", T.StringType()), T.StructField("status", T.StringType())])
GRANT_ANSWER = T.StructType([T.StructField("query_id", T.StringType()), T.StructField("granted", T.LongType())])
ARROW_TYPES = {T.StringType(): pa.string(), T.LongType(): pa.int64()}


def _typed(answer: pa.Table, schema: T.StructType) -> pa.Table:
    return answer.select(schema.fieldNames()).cast(pa.schema([pa.field(f.name, ARROW_TYPES[f.dataType]) for f in schema]))


def _per_partition(call, schema: T.StructType):
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        batches = [b for b in batches if b.num_rows]
        if batches:
            yield from _typed(call(pa.Table.from_batches(batches)), schema).to_batches()

    return run


def _via_driver(spark: SparkSession, answer: pa.Table, schema: T.StructType, path: Path) -> DataFrame:
    answer = _typed(answer, schema)
    return unstage(spark, pa.RecordBatchReader.from_batches(answer.schema, answer.to_batches()), path)


def lookup_ids(spark: SparkSession, registry: IdRegistry, ids: DataFrame, staging: Path) -> DataFrame:
    """`ids`: click_id, timestamp_us. Answer: click_id, token, status of registered and too-old ids."""
    remote = registry.for_executors()
    if remote is not None:
        answer = ids.mapInArrow(_per_partition(remote.lookup, LOOKUP_ANSWER), LOOKUP_ANSWER)
        return materialize(answer, staging / "answer")
    return _via_driver(spark, registry.lookup(stage(ids, staging / "ids")), LOOKUP_ANSWER, staging / "answer")


def commit_ids(spark: SparkSession, registry: IdRegistry, ids: DataFrame, token: str, staging: Path) -> DataFrame:
    """`ids`: click_id, timestamp_us. Answer: click_id, status (held, refused, too_old) per id."""
    remote = registry.for_executors()
    if remote is not None:
        answer = ids.mapInArrow(_per_partition(lambda t: remote.commit(t, token), COMMIT_ANSWER), COMMIT_ANSWER)
        return materialize(answer, staging / "answer")
    return _via_driver(spark, registry.commit(stage(ids, staging / "ids"), token), COMMIT_ANSWER, staging / "answer")


def grant_clicks(spark: SparkSession, registry: IdRegistry, wanted: DataFrame, token: str, cap: int,
                 staging: Path) -> DataFrame:
    """`wanted`: query_id, wanted, one row per query. Answer: query_id, granted (the per-query click
    cap: resources/click_caps.py)."""
    remote = registry.for_executors()
    if remote is not None:
        answer = wanted.mapInArrow(_per_partition(lambda t: remote.grant_clicks(t, token, cap), GRANT_ANSWER),
                                   GRANT_ANSWER)
        return materialize(answer, staging / "answer")
    granted = registry.grant_clicks(stage(wanted, staging / "wanted"), token, cap)
    return _via_driver(spark, granted, GRANT_ANSWER, staging / "answer")
