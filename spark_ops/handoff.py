"""Moving id batches between Spark and the registry as Parquet, never through driver Python objects.

Spark writes a batch as Parquet; the registry scans it as an Arrow dataset; the registry's answer
streams back, batch by batch, into Parquet that Spark reads.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType


def stage(df: DataFrame, path: Path) -> ds.Dataset:
    df.write.mode("overwrite").parquet(str(path))
    return ds.dataset(str(path), format="parquet")


def unstage(spark: SparkSession, answer: pa.RecordBatchReader, path: Path, schema: StructType | None = None) -> DataFrame:
    """`answer` written as Parquet at `path`, read by Spark with `schema` (the Spark schema it was
    converted from), or else with the Arrow schema's own."""
    path.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(str(path / "part-0.parquet"), answer.schema) as writer:
        for batch in answer:
            writer.write_batch(batch)
    # Read with the schema it was written with: inferring it is a Spark job of its own. Arrow's
    # timestamps without a zone are Spark's TIMESTAMP_NTZ, as inference would read them.
    schema = schema or from_arrow_schema(answer.schema, prefer_timestamp_ntz=True)
    return spark.read.schema(schema).parquet(str(path))


def materialize(df: DataFrame, path: Path) -> DataFrame:
    """`df` computed once, into Parquet under a work unit's staging directory, and read back.

    Later actions read the files instead of re-running the plan (an EventStore lookup or a registry
    call): a persisted frame would not do, since a Delta write drops cached frames and Spark then
    recomputes them inside the MERGE that reads them. Read back with the schema it was written with:
    inferring it costs a look at the files (~0.1 s).
    """
    df.write.mode("overwrite").parquet(str(path))
    return df.sparkSession.read.schema(df.schema).parquet(str(path))


def materialize_counted(df: DataFrame, path: Path, **counts: Column) -> tuple[DataFrame, dict]:
    """`materialize`, and aggregates of `df` (name -> column expression) observed while it is
    written: the counts a pass needs cost no job of their own."""
    observation = Observation(path.name)
    aggregates = [expr.alias(name) for name, expr in counts.items()]
    df.observe(observation, *aggregates).write.mode("overwrite").parquet(str(path))
    written = df.sparkSession.read.schema(df.schema).parquet(str(path))
    observed = observation.get
    if set(counts) - set(observed):
        # Over Spark Connect the metrics come with the write's response, and an empty dict stands for
        # none: once, a click run's write returned without them (a `photon up` being stopped; cause not
        # found) and the run failed on a missing count. The write committed: count its files instead.
        observed = written.agg(*aggregates).first().asDict()
    return written, observed
