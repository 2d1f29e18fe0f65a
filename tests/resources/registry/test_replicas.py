"""The replicated registry's replicas (resources/registry/replica.py) over a real etcd: determinism with
clocks that disagree, snapshots for a replica the log moved past, an op applied once however often it
is put, safety without a majority, and the refusals (credentials, a replicated directory opened as one
machine's registry)."""

import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from resources.registry.api import CallContext, RegistryIsReplicated, RegistryUnavailable, serving
from resources.registry.etcd_log import Credentials, Etcd, EtcdLog, EtcdRefused
from resources.registry.log_entries import Entry, Op
from resources.registry.replica import ReplicaSettings, ReplicatedIdRegistry
from resources.registry.replica_state import ReplicaState
from resources.registry import work_claims
from resources.registry.shards import ShardedIdRegistry, now_us
from resources.registry.work_claims import leases_held
from resources.state.layout import REPO_ROOT
from tests.conftest import start_etcd, stop_groups

NOW = now_us()
HOUR = 3_600_000_000


def events(*ids: str, ts: int = NOW) -> pa.Table:
    return pa.table({"click_id": list(ids), "timestamp_us": pa.array([ts] * len(ids), pa.int64())})


def statuses(table: pa.Table) -> dict[str, str]:
    return dict(zip(table.column("click_id").to_pylist(), table.column("status").to_pylist()))


def no_snapshot(address: str, path: Path) -> int:
    raise AssertionError("no snapshot expected")


@pytest.fixture
def etcd(tmp_path):
    processes, endpoints = start_etcd(tmp_path, members=1)
    try:
        yield endpoints
    finally:
        stop_groups(processes)


def replica(tmp_path: Path, endpoints: list[str], name: str, clock=now_us, snapshot_from=no_snapshot, **options):
    settings = ReplicaSettings(**{"gc_interval_seconds": 3600, **options})
    engine = ReplicatedIdRegistry(name, tmp_path / name, EtcdLog(Etcd(endpoints)), f"{name}.invalid:1",
                                  snapshot_from, clock=clock, settings=settings).start()
    assert engine.wait_ready(30)
    return engine


def test_two_replicas_fed_the_same_log_answer_alike_with_clocks_that_disagree(tmp_path, etcd):
    """Replica b's clock is three hours ahead of a's. Each proposes changes of every kind; both then
    hold the same ids, leases, claims, grants and digest, and each entry's answers (computed by each
    replica as it applied it) are the same in a third state fed the raw log."""
    # No trimming: the test replays the whole log into a third state.
    a = replica(tmp_path, etcd, "a", trim_every_seconds=3600)
    b = replica(tmp_path, etcd, "b", clock=lambda: now_us() + 3 * HOUR, trim_every_seconds=3600)
    try:
        assert statuses(a.commit(events("x", "y"), "T1")) == {"x": "held", "y": "held"}
        assert statuses(b.commit(events("y", "z"), "T2")) == {"y": "refused", "z": "held"}
        assert statuses(b.commit(events("x", "y"), "T1")) == {"x": "held", "y": "held"}  # a retry of T1
        assert a.clear_tokens("T1") == 2
        assert b.delete(events("z")) == 1
        assert b.heartbeat("dc2", 6) and a.heartbeat("dc1", 6)
        assert a.claim_work("dc1", "click", [{"unit": "dc1.click.1", "ranges": [["f.jsonl", 0, 100]]}]) == 1
        assert b.finish_work("dc1.click.1", pending=False) == 1
        granted = a.grant_clicks(pa.table({"query_id": ["q"], "wanted": pa.array([3], pa.int64())}), "T3", 2)
        assert granted.column("granted").to_pylist() == [2]
        old = events("old", ts=NOW - 5 * 24 * HOUR)
        assert statuses(a.commit(old, "T4")) == {"old": "held"}
        # b's GC stamps its clock (three hours ahead) in the entry: both replicas move the same boundary.
        assert b.collect_garbage()["deleted"] == {"0": 1}
        with serving(CallContext(min_revision=max(a.state.applied_revision, b.state.applied_revision))):
            asked = pa.concat_tables([events("x", "y", "z"), old])
            looked = [r.lookup(asked).sort_by("click_id").to_pylist() for r in (a, b)]
        assert looked[0] == looked[1]
        assert [(row["click_id"], row["status"]) for row in looked[0]] == [("old", "too_old"), ("x", "registered"),
                                                                          ("y", "registered")]
        assert a.work_claims("click", ["f.jsonl"]) == b.work_claims("click", ["f.jsonl"])
        assert a.state.leases(NOW) == b.state.leases(NOW)
        head = a.state.applied_revision
        assert a.digest(head) == {**b.digest(head), "replica": "a"}
        scans = [sorted(r.scan().read_all().to_pylist(), key=lambda row: row["click_id"]) for r in (a, b)]
        assert scans[0] == scans[1]

        fed = ReplicaState(tmp_path / "fed.duckdb")
        replayed = {}
        entries, _, _ = EtcdLog(Etcd(etcd)).read_after(0, limit=1000)
        for revision, raw in entries:
            replayed.update(fed.apply(revision, Entry.decode(raw)))
        assert fed.digest_at(head) == a.state.digest_at(head)
        assert replayed and all(isinstance(v, (pa.Table, dict, int, list)) for v in replayed.values())
    finally:
        a.close()
        b.close()


def test_an_op_is_applied_once_however_often_it_is_put(tmp_path, etcd):
    """A recovery's delete whose put was repeated (its answer lost) and committed late, after the ids
    were registered again, deletes nothing the second time: its request id was applied."""
    log = EtcdLog(Etcd(etcd))
    state = ReplicaState(tmp_path / "state.duckdb")
    delete = Entry("p", NOW, [Op("delete", "recovery-1", {}, events("c"))])
    entries = [Entry("p", NOW, [Op("commit", "c1", {"token": "A"}, events("c"))]), delete,
               Entry("p", NOW + 1, [Op("commit", "c2", {"token": "B"}, events("c"))]), delete]
    for entry in entries:
        log.append("p", entry.encode(), 10.0)
    found, _, _ = log.read_after(0, limit=100)
    answers = [state.apply(revision, Entry.decode(raw)) for revision, raw in found]
    assert answers[1] == {"recovery-1": 1} and answers[3] == {"recovery-1": 1}  # answered as the first time
    assert state.lookup(events("c")).column("token").to_pylist() == ["B"]  # not deleted again


def test_a_replica_the_log_moved_past_copies_a_live_one(tmp_path, etcd):
    """Entries every live replica applied are trimmed; a new replica then cannot apply the log from the
    start: it loads a snapshot of a live replica at a known revision and applies the rest."""
    from resources.registry.client import fetch_snapshot
    from resources.registry.service import RegistryServer

    a = replica(tmp_path, etcd, "a")
    server = RegistryServer(a, "127.0.0.1", 0)
    a.address = server.address
    try:
        for n in range(5):
            a.commit(events(*[f"id-{n}-{i}" for i in range(1000)]), f"T{n}")
        a._publish()
        a._trim()
        assert a.log.trimmed() == a.state.applied_revision
        c = replica(tmp_path, etcd, "c", snapshot_from=fetch_snapshot)
        try:
            assert c.counters_["snapshots_loaded"] == 1
            a.commit(events("after"), "T9")
            head = a.state.applied_revision
            assert c.digest(head) == {**a.digest(head), "replica": "c"}
            assert c.digest(head)["ids"] == 5001
        finally:
            c.close()
    finally:
        server.shutdown()
        a.close()


def test_without_an_etcd_majority_a_commit_waits_then_fails_retryably_and_none_is_answered(tmp_path, monkeypatch):
    """Two of three members stopped (SIGSTOP): a commit waits its proposal time, then fails with
    RegistryUnavailable; a stop does not wait on the leases' release; nothing is answered while they
    are stopped; continued, commits go on."""
    processes, endpoints = start_etcd(tmp_path, members=3)
    a = replica(tmp_path, endpoints, "a", proposal_seconds=4.0)
    try:
        a.commit(events("before"), "T1")
        for process in processes[1:]:
            os.kill(process.pid, signal.SIGSTOP)
        stopped = now_us()
        started = time.monotonic()
        with pytest.raises(RegistryUnavailable):
            a.commit(events("during"), "T2")
        assert 3.5 < time.monotonic() - started < 30
        monkeypatch.setattr(work_claims, "RELEASE_SECONDS", 1.0)
        started = time.monotonic()
        with leases_held(a, ["dc1"], 60.0, logging.getLogger("test")):
            pass  # its renewal and its release each wait out the proposal time (4 s) if nothing bounds them
        assert time.monotonic() - started < 3.5
        continued = now_us()
        for process in processes[1:]:
            os.kill(process.pid, signal.SIGCONT)
        deadline = time.monotonic() + 60
        while True:
            try:
                assert statuses(a.commit(events("during"), "T2")) == {"during": "held"}
                break
            except RegistryUnavailable:
                assert time.monotonic() < deadline
        answered = [t for _, t in a.answered]
        assert answered and not [t for t in answered if stopped < t < continued]
    finally:
        a.close()
        for process in processes:
            os.kill(process.pid, signal.SIGCONT)
        stop_groups(processes)


def test_etcd_with_authentication_refuses_a_client_without_credentials(tmp_path, etcd):
    """Off loopback the log is etcd's with its authentication on: a client without the user's
    credentials is refused, a replica without them exits with one line, a client with them writes."""
    env = {**os.environ, "ETCDCTL_API": "3"}
    ctl = ["etcdctl", "--endpoints", etcd[0]]
    for args in (["user", "add", "root:rootpass"], ["auth", "enable"]):
        subprocess.run([*ctl, *args], env=env, check=True, capture_output=True)
    with pytest.raises(EtcdRefused):
        Etcd(etcd).put(b"/photon/registry/log/x", b"entry")
    assert Etcd(etcd, Credentials(user="root", password="rootpass")).put(b"/photon/registry/log/x", b"entry") > 0
    started = time.monotonic()
    served = subprocess.run([sys.executable, "-m", "photon.cli", "registry", "serve", "--data-dir", str(tmp_path),
                             "--replica", "r1", "--etcd", etcd[0], "--port", "0"], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=60, env={k: v for k, v in os.environ.items() if "ETCD" not in k})
    assert served.returncode == 2 and time.monotonic() - started < 30
    assert served.stderr.strip().splitlines()[-1].startswith(f"photon: error: etcd at {etcd[0]} refused the request")


def test_a_replicated_data_directory_is_never_opened_as_one_machines_registry(tmp_path):
    registry_dir = tmp_path / "registry"
    registry_dir.mkdir()
    (registry_dir / "replicated.json").write_text(json.dumps({"replicas": 3}))
    with pytest.raises(RegistryIsReplicated, match="is replicated"):
        ShardedIdRegistry(registry_dir)
    served = subprocess.run([sys.executable, "-m", "photon.cli", "registry", "serve", "--data-dir", str(tmp_path),
                             "--port", "0"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert served.returncode == 2
    assert served.stderr.strip().splitlines() == [
        f"photon: error: the registry of {tmp_path} is replicated ({registry_dir / 'replicated.json'}): reach its "
        "replicas with PHOTON_REGISTRY_ADDRESS (`photon registry serve --replicas N` prints them), or give photon "
        "run / photon up --registry-replicas N"]


def test_a_bad_etcd_is_one_line_and_exit_2_within_30_seconds(tmp_path):
    (tmp_path / "logs" / "dc1" / "click").mkdir(parents=True)
    env = {**os.environ, "PHOTON_REGISTRY_ETCD": "http://127.0.0.1:9"}
    env.pop("PHOTON_REGISTRY_ADDRESS", None)
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "photon.cli", "run", "--data-dir", str(tmp_path), "--until-idle",
                             "--registry-replicas", "3"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                            env=env)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == "photon: error: etcd at 127.0.0.1:9 unreachable"
    assert time.monotonic() - started < 40  # 30 s for etcd, and the interpreter's start


def test_a_client_moves_off_a_dead_replica_and_back_once_it_is_ready(tmp_path, etcd):
    """A client whose preferred replica is down (connection refused) uses the next at once; once the
    preferred serves again it goes back (each datacenter's memory tier lives in its preferred one)."""
    from resources.registry import client as client_module
    from resources.registry.client import RemoteIdRegistry
    from resources.registry.service import RegistryServer
    from resources.spark.connect_server import free_port

    port = free_port()
    b = replica(tmp_path, etcd, "b")
    server_b = RegistryServer(b, "127.0.0.1", 0)
    client = RemoteIdRegistry([f"127.0.0.1:{port}", server_b.address], timeout_seconds=10)
    a = server_a = None
    try:
        assert statuses(client.commit(events("p"), "T")) == {"p": "held"}
        assert client.current == server_b.address
        a = replica(tmp_path, etcd, "a")
        server_a = RegistryServer(a, "127.0.0.1", port)
        client._away_checked = 0.0  # its next call asks whether the preferred one is back
        assert client.lookup(events("p")).num_rows == 1 and client.current == f"127.0.0.1:{port}"
        assert client.seen_revision >= b.state.applied_revision
    finally:
        client.close()
        for server, engine in ((server_a, a), (server_b, b)):
            if server is not None:
                server.shutdown()
            if engine is not None:
                engine.close()
    assert client_module.PROBE_SECONDS == 1.0


def test_the_replicas_check_fails_when_one_replica_applied_what_the_log_never_held(tmp_path, etcd):
    """`registry_replicas_agree` (in `verify`), through the service of two real replicas: it passes while
    both apply the log alone, and fails, saying how many id sets it found, once replica b applied a
    deletion that never went to etcd (what a replica bug or a damaged disk would leave)."""
    from photon_assets.checks import registry_replicas_agree
    from resources.id_registry import IdRegistryResource
    from resources.registry.service import RegistryServer

    a, b = replica(tmp_path, etcd, "a"), replica(tmp_path, etcd, "b")
    servers = [RegistryServer(a, "127.0.0.1", 0), RegistryServer(b, "127.0.0.1", 0)]
    resource = IdRegistryResource(data_dir=str(tmp_path), mode="service", address=",".join(s.address for s in servers))
    try:
        assert statuses(a.commit(events("x", "y"), "T1")) == {"x": "held", "y": "held"}
        agreed = registry_replicas_agree(resource)
        assert agreed.passed and agreed.metadata["distinct_id_sets"].value == 1
        with b.apply_lock:  # outside the log: b alone forgets "y", at a revision the log has not reached
            b.state.apply(b.state.applied_revision + 1, Entry("rogue", now_us(), [Op("delete", "rogue-1", {}, events("y"))]))
        assert statuses(a.commit(events("z"), "T2")) == {"z": "held"}  # the log moves past it
        differing = registry_replicas_agree(resource)
        assert not differing.passed
        assert (differing.metadata["replicas_answering"].value, differing.metadata["distinct_id_sets"].value) == (2, 2)
    finally:
        for server in servers:
            server.shutdown()
        a.close()
        b.close()
