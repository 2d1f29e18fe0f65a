"""Shared fixtures. One local Spark session serves the whole suite (a JVM start costs ~8 s on 2
cores), and one Spark Connect server the tests that opt in (`over_spark_connect`): each `photon run`
they start is then a client of a warm JVM, as a daemon's run is under `photon up`, instead of starting
and warming a JVM of its own. Under the full suite's workers (scripts/test.sh), each worker has its own."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from resources.runtime.process_groups import stop_group
from resources.spark.connect_server import free_port, server_environment, wait_until_serving
from resources.spark.session import SPARK_REMOTE_ENV, delta_session
from resources.state.layout import REPO_ROOT

# The quick tier (`scripts/test.sh --quick`, a few minutes): pure functions, sensors through
# build_sensor_context, the registry against real DuckDB, the generator, and one small
# end-to-end run of `photon run`. Everything else runs in the full suite.
QUICK = (
    "tests/sensors/",
    "tests/photon_assets/test_checks.py",
    "tests/scripts/",
    "tests/resources/test_id_registry.py",
    "tests/resources/registry/test_shards.py",
    "tests/resources/registry/test_work_claims.py",
    "tests/resources/state/test_watermark.py",
    "tests/resources/state/test_sidecars.py",
    "tests/resources/event_store/test_memory_tier.py",
    "tests/resources/event_store/test_tail_segments.py",
    "tests/resources/state/test_work_unit_log.py",
    "tests/resources/registry/test_ownership.py",
    "tests/resources/registry/test_replicas.py::test_an_op_is_applied_once_however_often_it_is_put",
    "tests/resources/registry/test_replicas.py::test_a_replicated_data_directory_is_never_opened",
    "tests/resources/spark/test_session.py",
    "tests/resources/runtime/test_stop_signal.py",
    "tests/resources/spark/test_class_archive.py::test_the_archive_reaches",
    "tests/resources/spark/test_class_archive.py::test_the_archive_is_named",
    "tests/resources/runtime/test_process_groups.py",
    "tests/resources/runtime/test_priority.py",
    "tests/photon/",
    "tests/spark_ops/test_events.py",
    "tests/spark_ops/test_tables.py",
    "tests/test_definitions.py",
    "tests/test_connect_compatible.py",
    "tests/e2e/test_photon_run.py::test_a_small_workload_end_to_end",
    "tests/e2e/test_photon_run.py::test_bad_invocations_fail_with_one_line",
    "tests/benchmarks/test_chaos.py::test_a_scenario_is_drawn_from_its_seed",
    "tests/benchmarks/test_rate_curve.py",
    "tests/benchmarks/test_chaos.py::test_runs_merge_only_on_the_product_code",
)


# The slowest modules (1 to 12 minutes each in a run on two workers, 2026-11-26), started first so
# that the full suite's two workers end together instead of one starting `photon up`'s test last.
SLOWEST_FIRST = (
    "tests/e2e/test_datacenters.py",
    "tests/e2e/test_replicated_registry.py",
    "tests/e2e/test_up.py",
    "tests/e2e/test_up_checks.py",
    "tests/e2e/test_up_freshness.py",
    "tests/e2e/test_photon_run.py",
    "tests/spark_ops/test_query_tiers.py",
    "tests/benchmarks/test_run.py",
    "tests/photon_assets/test_assets.py",
    "tests/e2e/test_ui.py",
    "tests/e2e/test_faults.py",
    "tests/e2e/test_cluster.py",
    "tests/spark_ops/test_join.py",
    "tests/e2e/test_check.py",
)


def start_order(item) -> int:
    return next((n for n, module in enumerate(SLOWEST_FIRST) if item.nodeid.startswith(module)), len(SLOWEST_FIRST))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(QUICK):
            item.add_marker(pytest.mark.quick)
    items.sort(key=start_order)


@pytest.fixture(scope="session")
def spark():
    return delta_session(shuffle_partitions=2, driver_memory="2g")


def click(click_id: str, query_id: str, ts: int, advertiser: str = "adv1", cost: int = 100, **extra) -> dict:
    return {"click_id": click_id, "query_id": query_id, "timestamp_us": ts, "ad_id": "ad1",
            "advertiser_id": advertiser, "cost_micros": cost, **extra}


def query(query_id: str, ts: int, **extra) -> dict:
    ads = [{"ad_id": "ad1", "advertiser_id": "adv1", "position": 1, "bid_micros": 500}]
    return {"query_id": query_id, "timestamp_us": ts, "query_text": f"q {query_id}", "ads": ads, **extra}


def write_lines(path: Path, lines: list, torn: str = "") -> Path:
    """Writes events (dicts) or raw strings as JSON lines, optionally followed by a torn line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join((json.dumps(line) if isinstance(line, dict) else line) + "\n" for line in lines)
    with open(path, "a", encoding="utf-8") as f:
        f.write(text + torn)
    return path


STOP_SECONDS = 30


def stop_groups(processes: list[subprocess.Popen]) -> None:
    """Each process's group stopped (stop_group), in the order given."""
    for process in processes:
        stop_group(process, STOP_SECONDS)


def start_spark_connect(log: Path, *options: str) -> tuple[subprocess.Popen, str]:
    """`photon spark-connect` in a process group of its own, once it serves; and its address."""
    port = free_port()
    with open(log, "ab") as output:
        server = subprocess.Popen([sys.executable, "-m", "photon.cli", "spark-connect", "--port", str(port), *options],
                                  cwd=REPO_ROOT, env=server_environment(), stdout=output, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    remote = f"sc://127.0.0.1:{port}"
    try:
        wait_until_serving(remote, server)
    except BaseException:
        stop_groups([server])
        raise
    return server, remote


@pytest.fixture(scope="session")
def spark_connect_server(tmp_path_factory):
    server, remote = start_spark_connect(tmp_path_factory.mktemp("connect") / "server.log", "--driver-memory", "4g")
    try:
        yield remote
    finally:
        stop_groups([server])


@pytest.fixture
def over_spark_connect(spark_connect_server, monkeypatch):
    """The test's `photon` commands run over the shared Connect server (PHOTON_SPARK_REMOTE)."""
    monkeypatch.setenv(SPARK_REMOTE_ENV, spark_connect_server)
    return spark_connect_server


def java_descendants(pid: int) -> list[int]:
    """The java processes under `pid` (Spark's launcher starts the JVM as this process's child or grandchild)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found = []
    for child in parents:
        ancestor = parents.get(child)
        while ancestor and ancestor != pid:
            ancestor = parents.get(ancestor)
        if ancestor == pid and (Path("/proc") / str(child) / "comm").read_text().strip() == "java":
            found.append(child)
    return found


def start_etcd(directory: Path, members: int = 1) -> tuple[list[subprocess.Popen], list[str]]:
    """A real etcd cluster of `members` on loopback (its members' data under `directory`), once a majority
    serves; the processes (each in a group of its own) and the client endpoints."""
    from resources.registry.etcd_log import Etcd, EtcdUnavailable
    from resources.spark.connect_server import free_port

    names = [f"etcd-{n}" for n in range(1, members + 1)]
    clients = {name: free_port() for name in names}
    peers = {name: free_port() for name in names}
    cluster = ",".join(f"{name}=http://127.0.0.1:{peers[name]}" for name in names)
    processes = []
    for name in names:
        client, peer = f"http://127.0.0.1:{clients[name]}", f"http://127.0.0.1:{peers[name]}"
        with open(directory / f"{name}.log", "ab") as log:
            processes.append(subprocess.Popen(
                ["etcd", "--name", name, "--data-dir", str(directory / name), "--listen-client-urls", client,
                 "--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", cluster, "--initial-cluster-state", "new", "--initial-cluster-token", "test",
                 "--heartbeat-interval", "250", "--election-timeout", "2500", "--logger", "zap", "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    endpoints = [f"http://127.0.0.1:{clients[name]}" for name in names]
    etcd = Etcd(endpoints)
    deadline = time.monotonic() + 60
    while True:
        try:
            etcd.request("/kv/range", {"key": "AA==", "count_only": True}, deadline_seconds=1.0)
            return processes, endpoints
        except EtcdUnavailable:
            if time.monotonic() > deadline:
                stop_groups(processes)
                raise
