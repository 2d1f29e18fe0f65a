"""The Spark Connect server's driver program (`spark-submit ... connect_driver.py`, resources/spark/connect_server.py).

Spark's own `SparkConnectServer` main forces `spark.sql.artifact.isolation.enabled` on, and with it
every Connect session gets Python workers of its own: the worker pool is keyed by the session's
artifact id (SPARK_JOB_ARTIFACT_UUID in the workers' environment). Under `photon up` each run is a
session, so each run started a worker daemon and workers that imported pyarrow and the project's
parsers again (after 15 minutes at 1,000 clicks/s: 49 Python workers holding 3.7 GB).
This driver starts the same service on a session whose configuration, spark-submit's, turns the
isolation off: every session then shares one pool of warm workers, as a local session's runs do.
The project adds no artifacts to its sessions, so there is nothing to isolate.

It creates the session before the service binds its port, so no client can arrive before a session
exists to be copied, and ends when the JVM that launched it ends.
"""

from __future__ import annotations

import os
import time


def main() -> None:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    context = SparkContext.getOrCreate()  # spark-submit's settings
    SparkSession(context)  # the active session each Connect session is made from
    context._jvm.org.apache.spark.sql.connect.service.SparkConnectService.start(context._jsc.sc())
    jvm = os.getppid()
    # SIGTERM ends this process (Python's default); the JVM's end, seen here, ends it too.
    while os.getppid() == jvm:
        time.sleep(1)


if __name__ == "__main__":
    main()
