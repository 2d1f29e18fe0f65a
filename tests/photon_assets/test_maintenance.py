"""Table maintenance's compaction (photon_assets/maintenance.py) on a real Delta table."""

import deltalake
import pyarrow as pa
from pyspark.sql import functions as F

from photon_assets.maintenance import small_files_held
from resources.spark.session import SMALL_FILE_BYTES
from spark_ops.tables import delta_path


def test_a_compaction_rewrites_the_small_files_only_and_counts_them(spark, tmp_path):
    """An earlier compaction's file (SMALL_FILE_BYTES or more) is neither counted toward the next
    compaction nor rewritten by it: a compaction costs what was appended since the last one."""
    path = str(tmp_path / "table")
    hashes = spark.range(250_000).select(F.col("id"), F.sha2(F.col("id").cast("string"), 512).alias("h"))
    hashes.coalesce(1).write.format("delta").save(path)
    [(earlier, size)] = zip(*pa.table(deltalake.DeltaTable(path).get_add_actions()).select(["path", "size_bytes"])
                            .to_pydict().values())
    assert size >= SMALL_FILE_BYTES
    for start in (1_000_000, 2_000_000, 3_000_000):
        hashes.where(F.col("id") < 10).withColumn("id", F.col("id") + start).coalesce(1).write.format("delta") \
            .mode("append").save(path)
    assert small_files_held(path) == 3

    metrics = spark.sql(f"OPTIMIZE {delta_path(path)}").collect()[0]["metrics"]
    assert (metrics["numFilesRemoved"], metrics["numFilesAdded"]) == (3, 1)
    files = pa.table(deltalake.DeltaTable(path).get_add_actions()).column("path").to_pylist()
    assert earlier in files and len(files) == 2
    assert small_files_held(path) == 1
    assert spark.read.format("delta").load(path).count() == 250_030
