"""The replicated registry (photon/registry_cluster.py) under real faults, two datacenters at a live rate
(`photon gen --follow`), in both modes: `photon run` with a local Spark session, and `photon up`.

In turn: (a) SIGKILL of an etcd member; (b) SIGKILL of the preferred replica, which holds both
datacenters' memory tiers; (c) the loss of a machine: an etcd member and a replica killed and their
directories deleted, then replaced and caught up; (d) a minority: two of three members stopped
(SIGSTOP) for 20 s, then continued, with no commit answered meanwhile. After each: no click joined
twice and every replica holding the same ids (their digests at one revision); at the end every
joinable click joined exactly once, and every check passes."""

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from photon.registry_cluster import ClusterConfig, member_dir, replica_dir
from resources.registry.client import RemoteIdRegistry
from resources.registry.shards import now_us
from resources.state.layout import REPO_ROOT, DataLayout
from tests.e2e.test_datacenters import assert_exactly_once, start_run
from tests.e2e.test_photon_run import PHOTON, assert_matches_ground_truth, photon
from tests.e2e.test_up import start_up, wait_for_output

pytestmark = [pytest.mark.e2e, pytest.mark.faults]

GEN_SECONDS = 100
STALL_SECONDS = 20


def live_workload(data_dir: Path, seed: int) -> subprocess.Popen:
    writer = subprocess.Popen([*PHOTON, "gen", "--data-dir", str(data_dir), "--follow", "--rate", "30", "--duration-s",
                               str(GEN_SECONDS), "--late-delay-s", "20", "--seed", str(seed), "--datacenters", "dc1,dc2"],
                              cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (data_dir / "logs" / "dc2" / "click").is_dir(), "the generator's first files", 60, writer)
    return writer


def wait_for(condition, what: str, seconds: float, *processes: subprocess.Popen):
    deadline = time.monotonic() + seconds
    while True:
        for process in processes:
            assert process.poll() is None, f"{what}: {process.args[:4]} exited with status {process.returncode}"
        found = condition()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what}: not within {seconds:.0f} s"
        time.sleep(0.3)


def pid_of(data_dir: Path, marker: str) -> int | None:
    """The live process whose command line holds the data directory and `marker`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(data_dir) in command and marker in command and state != "Z" and "setpriv" not in command.split()[0]:
            return int(entry.name)
    return None


def member(n: int) -> str:
    return f"--name etcd-{n} "


def replica(n: int) -> str:
    return f"--replica replica-{n} "


def cluster(data_dir: Path) -> ClusterConfig:
    return wait_for(lambda: ClusterConfig.load(DataLayout(data_dir)), "the cluster's configuration", 120)


def serving(data_dir: Path) -> bool:
    """Every member and replica running, every replica ready (its ready file)."""
    layout = DataLayout(data_dir)
    return all(pid_of(data_dir, member(n)) for n in (1, 2, 3)) and all(
        pid_of(data_dir, replica(n)) and (replica_dir(layout, f"replica-{n}") / "ready").exists() for n in (1, 2, 3))


def restarted(data_dir: Path, marker: str, killed: int) -> bool:
    pid = pid_of(data_dir, marker)
    return pid is not None and pid != killed and serving(data_dir)


def kill(data_dir: Path, marker: str) -> int:
    pid = pid_of(data_dir, marker)
    assert pid is not None, f"no process {marker!r}"
    os.kill(pid, signal.SIGKILL)
    return pid


def agreeing(addresses: list[str]) -> bool:
    """Every replica answers the same digest of its id set at one revision."""
    client = RemoteIdRegistry(addresses, timeout_seconds=10, max_attempts=2)
    try:
        agreement = client.replicas_agreement()
    except ConnectionError:
        return False
    finally:
        client.close()
    return agreement["replicas_answering"] == 3 and agreement["distinct_id_sets"] == 1 and agreement["revision"]


def no_click_twice(data_dir: Path) -> None:
    path = data_dir / "warehouse" / "joined_clicks"
    if (path / "_delta_log").is_dir():
        ids = DeltaTable(str(path)).to_pyarrow_table(columns=["click_id"]).column("click_id").to_pylist()
        assert len(ids) == len(set(ids)), "a click joined twice"


def after_each(data_dir: Path, config: ClusterConfig, *processes: subprocess.Popen) -> None:
    no_click_twice(data_dir)
    wait_for(lambda: agreeing(config.addresses()), "the replicas to agree", 120, *processes)
    print(f"{time.strftime('%X')}: invariants hold", flush=True)


def answered_between(addresses: list[str], start_us: int, end_us: int) -> list[dict]:
    """Commits any replica answered between the two times (its own record: revision, time)."""
    answered = []
    for address in addresses:
        client = RemoteIdRegistry(address, timeout_seconds=10)
        try:
            answered += [a for a in client.stats()["replica"]["answered_commits"] if start_us < a["answered_at_us"] < end_us]
        finally:
            client.close()
    return answered


def inject_each_fault(data_dir: Path, *processes: subprocess.Popen) -> None:
    """(a)-(d) of the module docstring, in turn, each waited out by state, with the invariants after it."""
    config = cluster(data_dir)
    layout = DataLayout(data_dir)
    wait_for(lambda: serving(data_dir) and (data_dir / "warehouse" / "joined_clicks" / "_delta_log").is_dir(),
             "the replicated registry serving, clicks joined", 300, *processes)

    killed = kill(data_dir, member(1))  # (a)
    wait_for(lambda: restarted(data_dir, member(1), killed), "etcd member 1 restarted", 120, *processes)
    after_each(data_dir, config, *processes)

    killed = kill(data_dir, replica(1))  # (b) the preferred replica: both datacenters' memory tiers
    wait_for(lambda: restarted(data_dir, replica(1), killed), "replica 1 restarted and ready", 180, *processes)
    after_each(data_dir, config, *processes)

    lost = (kill(data_dir, member(2)), kill(data_dir, replica(2)))  # (c) a machine
    shutil.rmtree(member_dir(layout, "etcd-2"), ignore_errors=True)
    shutil.rmtree(replica_dir(layout, "replica-2"), ignore_errors=True)
    wait_for(lambda: pid_of(data_dir, member(2)) not in (None, lost[0]) and restarted(data_dir, replica(2), lost[1]),
             "etcd member 2 replaced and replica 2 rebuilt", 240, *processes)
    after_each(data_dir, config, *processes)

    stalled = [pid_of(data_dir, member(n)) for n in (1, 3)]  # (d) the majority gone for 20 s
    stopped = now_us()
    for pid in stalled:
        os.kill(pid, signal.SIGSTOP)
    time.sleep(STALL_SECONDS)
    continued = now_us()
    for pid in stalled:
        os.kill(pid, signal.SIGCONT)
    after_each(data_dir, config, *processes)
    assert answered_between(config.addresses(), stopped + 1_000_000, continued) == []
    log = (data_dir / "state" / "registry-replica-2.log").read_text()
    assert "loaded a snapshot" in log  # (c)'s replica rebuilt from a live one's state


def test_photon_run_with_a_local_spark_session_keeps_exactly_once_through_registry_faults(tmp_path):
    """The faults come while `photon run` tails the live logs (it would tail for 15 minutes); once they and
    the writer are done it is interrupted (Ctrl-C), and the next `photon run` on the directory, on the
    same replicated registry, finishes the work and verifies it."""
    writer = live_workload(tmp_path, seed=41)
    pipeline = start_run(tmp_path, "--datacenters", "dc1,dc2", "--registry-replicas", "3", "--min-seconds", "900")
    try:
        inject_each_fault(tmp_path, pipeline)
        assert writer.wait(timeout=GEN_SECONDS + 60) == 0, writer.stderr.read()
        pipeline.send_signal(signal.SIGINT)  # ends it after the pass under way, even a pass inside a run
        _, err = pipeline.communicate(timeout=120)
        assert pipeline.returncode == 130 and "stopped by a signal before idle" in err, err[-3000:]
        assert pid_of(tmp_path, "etcd") is None and pid_of(tmp_path, "--replica") is None  # stopped with photon run
        final = start_run(tmp_path, "--datacenters", "dc1,dc2")
        out, err = final.communicate(timeout=900)
        assert final.returncode == 0, err[-3000:]
    finally:
        for process in (writer, pipeline):
            if process.poll() is None:
                process.kill()
    truth = json.loads((tmp_path / "gen_summary.json").read_text())
    summary = json.loads(out.strip().splitlines()[-1])
    assert_matches_ground_truth(summary, truth)
    assert summary["verification"]["registry_replicas_agree"] is True
    assert_exactly_once(tmp_path, truth)


def test_photon_up_keeps_exactly_once_through_registry_faults(tmp_path):
    writer = live_workload(tmp_path, seed=43)
    up = start_up(tmp_path, {}, extra=("--registry-replicas", "3", "--datacenters", "dc1,dc2"))
    try:
        inject_each_fault(tmp_path, up)
        assert writer.wait(timeout=GEN_SECONDS + 60) == 0, writer.stderr.read()
        truth = json.loads((tmp_path / "gen_summary.json").read_text())
        wait_for_output(tmp_path, truth, up)
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
            up.wait(timeout=60)
        if writer.poll() is None:
            writer.kill()
    assert up.returncode == 0
    assert_exactly_once(tmp_path, truth)
    checked = photon("check", "--data-dir", str(tmp_path), "--json")  # reuses the cluster: every check, agreement too
    assert checked.returncode == 0, checked.stderr[-3000:]
    outcome = {c["name"]: c for c in json.loads(checked.stdout.strip().splitlines()[-1])["checks"]}
    assert outcome["registry_replicas_agree"]["passed"] and outcome["registry_replicas_agree"]["metadata"]["replicas"] == 3
