"""The floor under `photon up`'s first joined click (issue 43): what a fresh Spark Connect server with
Delta costs before any of the pipeline's own work, on an otherwise idle machine.

Starts the server exactly as `photon up` does (resources/spark/connect_server.py), then, as one client:
the session; a job through a Python worker (mapInArrow over one row: the worker daemon's start and its
imports, as a click run's parse); a Delta append to a scratch table and a read of it back (the write
path's first commit). Each step once cold and once again warm, in seconds.

    python benchmarks/cold_start_probe.py

Writes benchmarks/results/<date>-cold-start-probe-<commit>.json.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.result_file import ResultFile  # noqa: E402


def identity(batches):
    yield from batches


def steps(spark, scratch: str) -> dict[str, float]:
    timings = {}
    started = time.monotonic()
    spark.range(1).collect()
    timings["first_job"] = time.monotonic() - started
    started = time.monotonic()
    spark.range(1).mapInArrow(identity, "id long").collect()
    timings["python_worker_job"] = time.monotonic() - started
    started = time.monotonic()
    spark.range(100).selectExpr("id", "cast(id as string) AS click_id").write.format("delta").mode("append").save(scratch)
    timings["delta_append"] = time.monotonic() - started
    started = time.monotonic()
    spark.read.format("delta").load(scratch).count()
    timings["delta_read"] = time.monotonic() - started
    return {k: round(v, 2) for k, v in timings.items()}


def main() -> None:
    from pyspark.sql import SparkSession

    from resources.spark.connect_server import free_port, server_command, server_environment, wait_until_serving

    port = free_port()
    remote = f"sc://127.0.0.1:{port}"
    results = ResultFile("cold_start_probe", "cold-start-probe")
    started = time.monotonic()
    log = open(Path(tempfile.gettempdir()) / "cold-start-probe-server.log", "wb")
    server = subprocess.Popen(server_command(port), cwd=REPO, env=server_environment(), stdout=log, stderr=log,
                              start_new_session=True)
    try:
        wait_until_serving(remote, server)
        serving = round(time.monotonic() - started, 2)
        begun = time.monotonic()
        spark = SparkSession.builder.remote(remote).getOrCreate()
        session = round(time.monotonic() - begun, 2)
        with tempfile.TemporaryDirectory() as scratch:
            cold = steps(spark, f"{scratch}/cold")
            warm = steps(spark, f"{scratch}/warm")
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    result = {"server_serving_seconds": serving, "session_seconds": session, "cold_seconds": cold, "warm_seconds": warm,
              "cold_total_seconds": round(serving + session + sum(cold.values()), 2)}
    results.write(result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(240, exit=True)  # a step that hangs says where, and ends the probe
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
