"""Spark's Python workers of our sessions (spark_ops/worker_daemon.py): forked with our tasks' modules
imported, without archives on their path that each task's import cache reset would re-read, and
without Dagster."""

import pyarrow as pa


def test_a_task_runs_in_a_worker_with_our_modules_and_no_spark_archives_on_its_path(spark):
    def worker_state(batches):  # defined here: pickled by value (this module is not on the workers' path)
        import sys

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pylist([{
            "archives": [p for p in sys.path if p.endswith((".jar", ".zip")) and "pyspark" in p],
            "preloaded": "spark_ops.parse" in sys.modules and "spark_ops.registry_calls" in sys.modules,
            "dagster": "dagster" in sys.modules,
            "pyspark_from": sys.modules["pyspark"].__file__,
        }])

    rows = spark.range(2).repartition(2).mapInArrow(
        worker_state, "archives array<string>, preloaded boolean, dagster boolean, pyspark_from string").collect()
    assert len(rows) == 2
    for row in rows:
        assert row.archives == [] and row.preloaded and not row.dagster
        assert ".zip" not in row.pyspark_from
