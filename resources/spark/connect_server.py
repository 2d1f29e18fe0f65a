"""The long-lived Spark behind a deployment: a Spark Connect server with Delta, started by the project.

The server is in the pyspark wheel (no start script ships with it): `spark-submit` of our driver
program (resources/spark/connect_driver.py, which starts Spark's Connect service on its session),
with the same settings as a local session (resources/spark/session.py: delta_conf) and one more: sessions
share their Python workers (`spark.sql.artifact.isolation.enabled` off; why: the driver's docstring).
Its Python workers (mapInArrow: parsing, registry calls) and the driver itself run the project's
interpreter, hence PYSPARK_PYTHON in its environment. `SERVER_MARKER` is in the JVM's command line.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pyspark.find_spark_home import _find_spark_home

from resources.spark.session import DRIVER_MEMORY, delta_conf

DRIVER = Path(__file__).with_name("connect_driver.py")
SERVER_MARKER = "photon-connect"


def server_command(port: int, master: str = "local[2]", driver_memory: str = DRIVER_MEMORY, shuffle_partitions: int = 4,
                   host: str = "127.0.0.1") -> list[str]:
    conf = {
        **delta_conf(shuffle_partitions),
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": host,
        "spark.driver.bindAddress": host,
        "spark.ui.enabled": "false",
        # One pool of Python workers for every session (connect_driver.py).
        "spark.sql.artifact.isolation.enabled": "false",
        # Executors of a standalone cluster run the same interpreter for their Python workers.
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
    }
    settings = [arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")]
    return [
        str(Path(_find_spark_home()) / "bin" / "spark-submit"),
        "--name", SERVER_MARKER, "--master", master, "--driver-memory", driver_memory, *settings, str(DRIVER),
    ]


def server_environment(host: str = "127.0.0.1") -> dict[str, str]:
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": host}


def wait_until_serving(remote: str, server: subprocess.Popen | None, timeout_seconds: float = 120.0) -> None:
    """Returns once the server at `remote` (sc://HOST:PORT) accepts connections: it binds its port
    only after its Spark session is up. Raises if the server process exits first or the time runs
    out. (A TCP probe, not a client: a gRPC client's threads would make the caller's later forks
    unsafe.)"""
    host, port = remote.removeprefix("sc://").split("/")[0].rsplit(":", 1)

    def check_alive() -> None:
        if server is not None and server.poll() is not None:
            raise RuntimeError(f"the Spark Connect server exited with status {server.returncode} before serving")

    wait_until_listening(host, int(port), check_alive, timeout_seconds, f"the Spark Connect server at {remote}")


def wait_until_listening(host: str, port: int, check_alive: Callable[[], None], timeout_seconds: float,
                         what: str) -> None:
    """Returns once `host:port` accepts a TCP connection; `check_alive` raises if the server is gone.
    Raises RuntimeError naming `what` when the time runs out."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        check_alive()
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not serve within {timeout_seconds:.0f} s") from None
            time.sleep(0.2)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]
