"""The registry service: real server processes (`photon registry serve`) and the Flight client."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from resources.registry.client import RegistryAuthenticationError, RegistryUnavailable, RemoteIdRegistry
from resources.registry.service import RegistryServer
from resources.registry.shards import ShardedIdRegistry, now_us

REPO = Path(__file__).resolve().parents[3]
NOW = now_us()


def events(*ids: str, ts: int = NOW) -> pa.Table:
    return pa.table({"click_id": list(ids), "timestamp_us": pa.array([ts] * len(ids), pa.int64())})


def statuses(table: pa.Table) -> dict[str, str]:
    return dict(zip(table.column("click_id").to_pylist(), table.column("status").to_pylist()))


def environment(secret: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PHOTON_REGISTRY_SECRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    if secret:
        env["PHOTON_REGISTRY_SECRET"] = secret
    return env


def photon(*args: str, secret: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "photon.cli", *args], cwd=REPO, env=environment(secret),
                          capture_output=True, text=True, timeout=60)


class Server:
    """A `photon registry serve` process on port 0; its address comes from the ready file."""

    def __init__(self, data_dir: Path, *extra: str, secret: str | None = None):
        ready = data_dir / f"ready-{time.monotonic_ns()}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "photon.cli", "registry", "serve", "--data-dir", str(data_dir), "--port", "0",
             "--ready-file", str(ready), *extra], cwd=REPO, env=environment(secret), stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while not ready.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"registry server did not start: {self.process.stderr.read().decode()[-500:]}")
            time.sleep(0.05)
        self.address = ready.read_text()

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout=20)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("served"), "--shards", "4")
    yield server
    assert server.stop() == 0  # SIGTERM is a graceful stop


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_remote_registry_contract(server):
    registry = RemoteIdRegistry(server.address)
    assert statuses(registry.commit(events("a", "b", "a"), "svc-1")) == {"a": "held", "b": "held"}
    assert statuses(registry.commit(events("b", "c"), "svc-2")) == {"b": "refused", "c": "held"}
    assert statuses(registry.commit(events("a", "b"), "svc-1")) == {"a": "held", "b": "held"}
    assert registry.lookup(events("a", "zz")).to_pylist() == [{"click_id": "a", "token": "svc-1", "status": "registered"}]
    assert registry.clear_tokens("svc-1") == 2
    assert statuses(registry.commit(events("a"), "svc-1")) == {"a": "refused"}
    assert registry.delete(events("c", "zz")) == 1
    scanned = {r["click_id"]: r["token"] for r in registry.scan().read_all().to_pylist()}
    assert {k: scanned[k] for k in ("a", "b")} == {"a": None, "b": None} and "c" not in scanned
    with pytest.raises(ValueError, match="earlier than now"):
        registry.reshard(8, effective_at_us=1)
    assert registry.collect_garbage()["deleted"] == {str(n): 0 for n in range(4)}
    # Work ownership travels as actions too.
    assert registry.heartbeat("dc1", 30)["dc1"] > 29
    assert registry.claim_work("dc1", "click", [{"unit": "dc1.click.1", "ranges": [["f.jsonl", 0, 9]]}]) == 1
    assert registry.finish_work("dc1.click.1", pending=False) == 1
    [claim] = registry.work_claims("click", ["f.jsonl"])
    assert (claim["dc"], claim["start"], claim["end"], claim["state"]) == ("dc1", 0, 9, "done")
    # The per-query click cap's grants travel as an exchange: what other units hold counts, a unit
    # asking again gets its first answer.

    def grants(token, **wanted):
        answer = registry.grant_clicks(pa.table({"query_id": list(wanted), "wanted": list(wanted.values())}), token, 5)
        return dict(zip(answer["query_id"].to_pylist(), answer["granted"].to_pylist()))

    assert grants("u1", q1=3, q2=9) == {"q1": 3, "q2": 5}
    assert grants("u2", q1=4, q2=1) == {"q1": 2, "q2": 0}
    assert grants("u2", q1=9, q3=1) == {"q1": 2, "q3": 1}
    with pytest.raises(ValueError, match="lacks column"):
        registry.grant_clicks(pa.table({"query_id": ["q1"]}), "u3", 5)
    registry.close()


CLIENT = """
import json, sys
import pyarrow as pa
from resources.registry.client import RemoteIdRegistry
address, token, ts, ids = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.stdin.read())
registry = RemoteIdRegistry(address)
held = []
for start in range(0, len(ids), 100):
    chunk = ids[start:start + 100]
    answer = registry.commit(pa.table({"click_id": chunk, "timestamp_us": [ts] * len(chunk)}), token)
    held += [i for i, s in zip(answer["click_id"].to_pylist(), answer["status"].to_pylist()) if s == "held"]
print(json.dumps(held))
"""


def test_concurrent_threads_and_processes_partition_the_ids(server):
    universe = [f"race-{i}" for i in range(3000)]
    # Overlapping sets in different orders: every id is wanted by several clients.
    wanted = {f"thread-{n}": universe[n * 250:] + universe[: n * 250] for n in range(8)}
    wanted |= {f"proc-{n}": list(reversed(universe))[n * 500:] for n in range(3)}
    procs = {token: subprocess.Popen([sys.executable, "-c", CLIENT, server.address, token, str(NOW)], cwd=REPO,
                                     env=environment(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for token in wanted if token.startswith("proc")}
    held: dict[str, list[str]] = {}

    def client(token: str) -> None:
        registry = RemoteIdRegistry(server.address)
        mine = []
        for start in range(0, len(wanted[token]), 100):
            answer = statuses(registry.commit(events(*wanted[token][start:start + 100]), token))
            mine += [i for i, status in answer.items() if status == "held"]
        held[token] = mine

    threads = [threading.Thread(target=client, args=(token,)) for token in wanted if token.startswith("thread")]
    for thread in threads:
        thread.start()
    for token, proc in procs.items():
        out, _ = proc.communicate(json.dumps(wanted[token]), timeout=60)
        held[token] = json.loads(out)
    for thread in threads:
        thread.join()
    owners: dict[str, str] = {}
    for token, ids in held.items():
        for click_id in ids:
            assert owners.setdefault(click_id, token) == token, f"{click_id} held by two tokens"
    assert sorted(owners) == sorted(universe)
    found = RemoteIdRegistry(server.address).lookup(events(*universe))
    assert dict(zip(found["click_id"].to_pylist(), found["token"].to_pylist())) == owners
    remote = RemoteIdRegistry(server.address)
    stats, counters = remote.stats()["total"], remote.counters()["total"]
    assert stats["transactions"] < stats["requests_received"]  # requests shared transactions
    # The counters alone: the same, without the ids held (counted by a scan of every shard).
    assert stats["ids_registered"] >= len(universe) and "ids_registered" not in counters
    assert {k: counters[k] for k in ("transactions", "ids_in_transactions")} == \
        {k: stats[k] for k in ("transactions", "ids_in_transactions")}


class LosingServer(RegistryServer):
    """Applies the first commit, then fails the call as if its answer was lost on the network."""

    lose = 1

    def do_exchange(self, context, descriptor, reader, writer):
        if self.lose and json.loads(descriptor.command)["op"] == "commit":
            self.lose -= 1
            self.registry.commit(reader.read_all(), json.loads(descriptor.command)["token"])
            raise flight.FlightUnavailableError("connection reset (answer lost)")
        return super().do_exchange(context, descriptor, reader, writer)


def test_retry_after_a_lost_answer_gets_the_ids_back_with_the_same_token(tmp_path):
    registry = ShardedIdRegistry(tmp_path, shards=2, gc_interval_seconds=None)
    server = LosingServer(registry)
    try:
        client = RemoteIdRegistry(server.address, backoff_seconds=0.01)
        ids = [f"lost-{i}" for i in range(50)]
        assert set(statuses(client.commit(events(*ids), "unit-1")).values()) == {"held"}
        assert server.lose == 0 and registry.stats()["total"]["ids_registered"] == 50
        assert set(statuses(client.commit(events(*ids), "unit-2")).values()) == {"refused"}
    finally:
        server.shutdown()
        registry.close()


def test_acknowledged_commits_survive_sigkill(tmp_path):
    server = Server(tmp_path, "--shards", "3")
    registry = RemoteIdRegistry(server.address)
    acknowledged = []
    for n in range(10):
        ids = [f"durable-{n}-{i}" for i in range(500)]
        assert set(statuses(registry.commit(events(*ids), f"unit-{n}")).values()) == {"held"}
        acknowledged += ids
    assert server.stop(signal.SIGKILL) == -signal.SIGKILL
    restarted = Server(tmp_path)
    try:
        found = RemoteIdRegistry(restarted.address).lookup(events(*acknowledged))
        assert found.num_rows == len(acknowledged)
        assert set(found.column("status").to_pylist()) == {"registered"}
    finally:
        assert restarted.stop() == 0


def test_a_burst_of_sigterms_stops_the_server_and_frees_its_files(tmp_path):
    """A SIGKILLed `photon run` sends its registry child a burst of parent-death SIGTERMs, one each
    time the child passes to another of its dying threads. A handler taking a lock deadlocked on the
    second signal in 2 of 10 such bursts: the server lived on and the next run could not open the files."""
    for n in range(8):
        server = Server(tmp_path)  # starts only once the previous one has let go of the files
        RemoteIdRegistry(server.address).commit(events(f"burst-{n}"), f"unit-{n}")
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline and server.process.poll() is None:
            try:
                os.kill(server.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                break
        # A signal that comes while the interpreter exits, after the registry closed, meets the
        # default action: -SIGTERM then is an orderly stop too.
        assert server.process.wait(timeout=20) in (0, -signal.SIGTERM)
    last = Server(tmp_path)
    try:
        found = RemoteIdRegistry(last.address).lookup(events(*(f"burst-{n}" for n in range(8))))
        assert set(found.column("status").to_pylist()) == {"registered"} and found.num_rows == 8
    finally:
        assert last.stop() == 0


def test_unreachable_server_raises_one_line_within_bounded_time():
    address = f"127.0.0.1:{free_port()}"
    registry = RemoteIdRegistry(address, timeout_seconds=2, max_attempts=3, backoff_seconds=0.05)
    started = time.monotonic()
    with pytest.raises(RegistryUnavailable) as caught:
        registry.commit(events("a"), "unit-1")
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert message.startswith(f"registry at {address} unreachable after 3 attempts: ") and "\n" not in message
    assert isinstance(caught.value, ConnectionError)
    result = photon("registry", "stats", "--address", address)
    assert result.returncode == 1 and result.stderr.startswith(f"photon: error: registry at {address} unreachable")


def test_shared_secret_is_required_and_not_retried(tmp_path):
    server = Server(tmp_path, secret="s3cret")
    try:
        for secret in (None, "wrong"):
            started = time.monotonic()
            with pytest.raises(RegistryAuthenticationError, match="rejected the credentials"):
                RemoteIdRegistry(server.address, secret, backoff_seconds=1.0).commit(events("a"), "unit-1")
            assert time.monotonic() - started < 1.0  # no backoff: not retried
        good = RemoteIdRegistry(server.address, "s3cret")
        assert statuses(good.commit(events("a"), "unit-1")) == {"a": "held"}
        assert photon("registry", "stats", "--address", server.address).returncode == 1
        result = photon("registry", "stats", "--address", server.address, secret="s3cret")
        assert result.returncode == 0
        stats = json.loads(result.stdout)
        assert stats["total"]["ids_registered"] == 1
        assert stats["configuration"] == [{"start_us": 0, "end_us": None, "shards": 1}]
        result = photon("registry", "reshard", "--address", server.address, "--shards", "2", secret="s3cret")
        assert result.returncode == 0 and [c["shards"] for c in json.loads(result.stdout)] == [1, 2]
    finally:
        assert server.stop() == 0


def test_cli_usage_errors_exit_2(tmp_path):
    result = photon("registry", "reshard", "--address", "nowhere", "--shards", "2")
    assert result.returncode == 2 and result.stderr == "photon: error: registry address 'nowhere' is not HOST:PORT\n"
    assert photon("registry", "serve", "--data-dir", str(tmp_path)).returncode == 2
