"""Moving id batches between Spark and the registry as Parquet, never through driver Python objects.

Spark writes a batch as Parquet; the registry scans it as an Arrow dataset; the registry's answer
streams back, batch by batch, into Parquet that Spark reads.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession


def stage(df: DataFrame, path: Path) -> ds.Dataset:
    df.write.mode("overwrite").parquet(str(path))
    return ds.dataset(str(path), format="parquet")


def unstage(spark: SparkSession, answer: pa.RecordBatchReader, path: Path) -> DataFrame:
    path.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(str(path / "part-0.parquet"), answer.schema) as writer:
        for batch in answer:
            writer.write_batch(batch)
    return spark.read.parquet(str(path))
