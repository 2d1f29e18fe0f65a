"""The project's Spark Connect server (resources/spark/connect_server.py): its sessions, one per run
under `photon up`, share one pool of Python workers, so a run after another finds them warm."""

import json
import subprocess
import sys

# A client in a process of its own, as each run under `photon up` is: a Connect session made in the
# test's process would turn pyspark there to Connect mode, and break the classic session of the tests
# that share it.
CLIENT = """
import json, os, sys
import pyarrow as pa
from pyspark.sql import SparkSession

def worker_daemon(batches):
    for _ in batches:
        pass
    # A worker is forked by its pool's daemon: the daemon is the pool.
    yield pa.record_batch([pa.array([os.getppid()], pa.int64())], names=["pid"])

session = SparkSession.builder.remote(sys.argv[1]).create()  # a session of its own, as each run's
try:
    rows = session.range(0, 4, numPartitions=1).mapInArrow(worker_daemon, "pid long").collect()
    print(json.dumps(sorted({row.pid for row in rows})))
finally:
    session.stop()
"""


def daemons_of_a_new_session(remote: str) -> list[int]:
    done = subprocess.run([sys.executable, "-c", CLIENT, remote], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_sessions_share_their_python_workers(spark_connect_server):
    first = daemons_of_a_new_session(spark_connect_server)
    # A new session, after the first ended: its task runs in a worker of the same pool, forked by the
    # same daemon (usually the very worker the first left idle; once, under the full suite's load, a
    # fresh one). Spark's own server main keys the pool by session: a new daemon.
    assert daemons_of_a_new_session(spark_connect_server) == first
