"""The project's Spark Connect server (resources/runtime/spark_connect.py): its sessions, one per run
under `photon up`, share one pool of Python workers, so a run after another finds them warm."""

import os
from typing import Iterator

import pyarrow as pa
from pyspark.sql import SparkSession


def pids_of_a_new_session(remote: str) -> set[int]:
    def worker_pid(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # Nested: pickled by value (the workers cannot import this test module).
        for _ in batches:
            pass
        yield pa.record_batch([pa.array([os.getpid()], pa.int64())], names=["pid"])

    session = SparkSession.builder.remote(remote).create()  # a session of its own, as each run's
    try:
        rows = session.range(0, 4, numPartitions=1).mapInArrow(worker_pid, "pid long").collect()
        return {row.pid for row in rows}
    finally:
        session.stop()


def test_sessions_share_their_python_workers(spark_connect_server):
    first = pids_of_a_new_session(spark_connect_server)
    # A new session, after the first ended: its task runs in the worker the first one left idle.
    # (Spark's own server main keys the pool by session: a new daemon, a new worker.)
    assert pids_of_a_new_session(spark_connect_server) == first
