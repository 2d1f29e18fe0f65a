"""Two datacenters sharing one registry, and the fault-injection suite of issue 5: real processes are
killed (pipelines, the registry server), pipelines of both datacenters run at the same time, an
output file is deleted behind the pipeline's back. After each scenario the invariants of docs/CONTRACTS.md
hold: no duplicate, nothing lost once recovery ran (the ground truth of `photon gen` decides). Every
`photon run` is a client of the suite's Spark Connect server (tests/conftest.py)."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from resources.registry.client import RemoteIdRegistry
from resources.registry.ownership import preferred_dc
from resources.spark.connect_server import free_port
from resources.state.layout import REPO_ROOT
from tests.e2e.test_photon_run import PHOTON, assert_matches_ground_truth, photon, run

pytestmark = [pytest.mark.e2e, pytest.mark.faults, pytest.mark.usefixtures("over_spark_connect")]


def generate(data_dir: Path, *extra: str) -> dict:
    result = photon("gen", "--data-dir", str(data_dir), "--queries", "1500", "--seed", "23", *extra)
    assert result.returncode == 0, result.stderr
    return json.loads((data_dir / "gen_summary.json").read_text())


class RegistryServer:
    """`photon registry serve` on a fixed port, so that a restarted server has the same address."""

    def __init__(self, data_dir: Path, port: int):
        self.data_dir, self.port, self.address = data_dir, port, f"127.0.0.1:{port}"
        self.process = None

    def start(self) -> "RegistryServer":
        ready = self.data_dir / "state" / f"test-registry-{time.monotonic_ns()}"
        ready.parent.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir / "state" / "test-registry.log", "ab") as log:
            self.process = subprocess.Popen(
                [*PHOTON, "registry", "serve", "--data-dir", str(self.data_dir), "--port", str(self.port),
                 "--ready-file", str(ready)], cwd=REPO_ROOT, stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert self.process.poll() is None and time.monotonic() < deadline, "registry server did not start"
            time.sleep(0.1)
        return self

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


def start_run(data_dir: Path, *extra: str, env_extra: dict | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "PHOTON_FAULT"}
    return subprocess.Popen([*PHOTON, "run", "--data-dir", str(data_dir), "--until-idle", "--json", *extra],
                            cwd=REPO_ROOT, env={**env, **(env_extra or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(process: subprocess.Popen, timeout: float = 900) -> dict:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def joined_ids(data_dir: Path) -> list[str]:
    return DeltaTable(str(data_dir / "warehouse" / "joined_clicks")).to_pyarrow_table(columns=["click_id"]) \
        .column("click_id").to_pylist()


def assert_exactly_once(data_dir: Path, truth: dict) -> None:
    """The independent reader's view: every joinable click once, nothing else."""
    ids = joined_ids(data_dir)
    assert len(ids) == len(set(ids)), "duplicate click_id in joined_clicks"
    assert set(ids) == set(truth["joinable_click_ids"])


def table_versions(data_dir: Path) -> dict[str, int]:
    return {table.name: DeltaTable(str(table)).version() for table in (data_dir / "warehouse").iterdir()
            if (table / "_delta_log").is_dir()}


def test_both_datacenters_at_once_share_the_work_without_waste(tmp_path):
    truth = generate(tmp_path, "--datacenters", "dc1,dc2", "--rotate-bytes", "4096")  # files to share
    registry = RegistryServer(tmp_path, free_port()).start()
    try:
        env = {"PHOTON_REGISTRY_ADDRESS": registry.address}
        dc1 = start_run(tmp_path, "--datacenters", "dc1", env_extra=env)
        dc2 = start_run(tmp_path, "--datacenters", "dc2", env_extra=env)
        first, second = finished(dc1), finished(dc2)
        versions = table_versions(tmp_path)
        # Verified again once both are done: each verified while the other may still have been joining.
        # With nothing new, the run adds nothing, not even a table version.
        final = run(tmp_path, "--datacenters", "dc1", env_extra=env)
    finally:
        registry.stop()
    assert_matches_ground_truth(final, truth)
    assert_exactly_once(tmp_path, truth)
    assert final["runs"] == 0 and table_versions(tmp_path) == versions
    joiners = [first["joiner_by_dc"]["dc1"], second["joiner_by_dc"]["dc2"]]
    assert sum(j["joined"] for j in joiners) == truth["joinable_clicks"]
    # Active-active (resources/registry/ownership.py): each joined its own share of the files and skipped the
    # other's finished ranges unread; wasted joins (joined, then refused by the registry) stay under 1 %.
    assert all(j["joined"] > 0 for j in joiners), joiners
    assert all(j["clicks"] >= j["joined"] + j["refused"] for j in joiners), joiners  # every joined click was looked up
    assert sum(j["refused"] for j in joiners) <= 0.01 * truth["joinable_clicks"], joiners
    for summary in (first, second):
        assert all(summary["verification"].values()), summary["verification"]


def test_a_killed_datacenters_share_is_taken_over_and_it_resumes_when_back(tmp_path):
    """SIGKILL of one datacenter's `photon run` while its first work unit is claimed: once its lease
    lapses, the other joins that unit's bytes and the rest of its share; when it comes back, its
    killed run is retried, and every joinable click is joined once."""
    truth = generate(tmp_path, "--datacenters", "dc1,dc2", "--rotate-bytes", "4096")
    registry = RegistryServer(tmp_path, free_port()).start()
    env = {"PHOTON_REGISTRY_ADDRESS": registry.address, "PHOTON_SETTINGS": json.dumps({"lease_seconds": 4})}
    client = RemoteIdRegistry(registry.address)
    files = sorted(str(p.relative_to(tmp_path / "logs" / "dc1" / "click"))
                   for p in (tmp_path / "logs" / "dc1" / "click").rglob("*.jsonl"))
    pipelines = []
    try:
        pipelines.append(dc1 := start_run(tmp_path, "--datacenters", "dc1", env_extra=env))
        pipelines.append(dc2 := start_run(tmp_path, "--datacenters", "dc2", env_extra=env))
        deadline = time.monotonic() + 600
        while not any(c["dc"] == "dc2" for c in client.work_claims("click", files)):
            assert dc2.poll() is None, f"dc2 exited with status {dc2.returncode}: {dc2.communicate()[1][-3000:]}"
            assert time.monotonic() < deadline, "dc2 claimed no work"
            time.sleep(0.05)
        dc2.send_signal(signal.SIGKILL)
        killed_us = time.time_ns() // 1000
        dc2.communicate(timeout=120)
        survivor = finished(dc1)
        claims = client.work_claims("click", files)
        back = run(tmp_path, "--datacenters", "dc2", env_extra=env)
    finally:
        for pipeline in pipelines:
            if pipeline.poll() is None:
                pipeline.kill()
                pipeline.communicate()
        client.close()
        registry.stop()
    dc2_share = [c for c in claims if preferred_dc(c["file"], {"dc1", "dc2"}) == "dc2"]
    taken_over = [c for c in dc2_share if c["dc"] == "dc1" and c["claimed_us"] > killed_us and c["state"] != "claimed"]
    assert taken_over, dc2_share
    assert all(survivor["verification"].values()), survivor["verification"]
    assert_matches_ground_truth(back, truth)
    assert_exactly_once(tmp_path, truth)


def test_a_second_run_of_one_datacenter_is_refused_and_one_line(tmp_path):
    generate(tmp_path)
    locks = tmp_path / "state" / "locks"
    locks.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)",
                               str(locks / "dc1.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        result = photon("run", "--data-dir", str(tmp_path), "--until-idle", timeout=120)
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == f"photon: error: another photon run is running datacenter dc1 of {tmp_path}"


def test_registry_server_killed_and_restarted_mid_run(tmp_path):
    truth = generate(tmp_path)
    registry = RegistryServer(tmp_path, free_port()).start()
    env = {"PHOTON_REGISTRY_ADDRESS": registry.address}
    pipeline = start_run(tmp_path, env_extra=env)
    try:
        # Once clicks are being joined, the registry dies, and comes back 3 s later on the same files.
        deadline = time.monotonic() + 300
        while not (tmp_path / "warehouse" / "joined_clicks" / "_delta_log").is_dir():
            assert pipeline.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        registry.kill()
        time.sleep(3)
        registry.start()
        pipeline.communicate(timeout=900)
        # Work units whose registry calls failed meanwhile were retried; a pipeline that gave some up
        # is run again, as an operator would.
        final = run(tmp_path, env_extra=env)
    finally:
        if pipeline.poll() is None:
            pipeline.kill()
        registry.stop()
    assert_matches_ground_truth(final, truth)
    assert_exactly_once(tmp_path, truth)


def test_a_photon_runs_own_registry_service_killed_stops_it_with_one_line(tmp_path):
    """Without PHOTON_REGISTRY_ADDRESS, `photon run` serves the registry from a child process; nothing
    restarts it, so once it is killed the run stops with a one-line error instead of failing run
    after run until its timeout (what the external service's test above recovers from, and the
    photon up test after it, is the exactly-once part)."""
    generate(tmp_path)
    pipeline = start_run(tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "state" / "registry.address").exists():
            assert pipeline.poll() is None and time.monotonic() < deadline, "the registry service did not start"
            time.sleep(0.1)
        # Every thread's children: the supervisor forks on a thread of its own (photon/supervisor.py).
        children = [pid for task in Path(f"/proc/{pipeline.pid}/task").iterdir()
                    for pid in (task / "children").read_text().split()]
        served = [pid for pid in children if b"registry\0serve" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(served) == 1, children
        os.kill(int(served[0]), signal.SIGKILL)
        _, err = pipeline.communicate(timeout=120)
    finally:
        if pipeline.poll() is None:
            pipeline.kill()
            pipeline.wait()
    assert pipeline.returncode == 1, err[-3000:]
    assert err.strip().splitlines()[-1].startswith(
        "photon: error: the local registry service exited with status -9; state is kept, run again to continue; see "
    ), err[-3000:]


def delta_commits(data_dir: Path) -> int:
    """Commits so far across every Delta table of the data directory."""
    return sum(1 for entry in (data_dir / "warehouse").rglob("*.json") if entry.parent.name == "_delta_log")


def test_pipeline_sigkilled_at_random_moments_then_rerun(tmp_path):
    """Three times, `photon run` is SIGKILLed at a random point of its work: once it has made a
    random number (2-12) of Delta commits, of any table, plus a random 0-2 s."""
    truth = generate(tmp_path)
    rng = random.Random(5)
    kills = 0
    for _ in range(3):
        pipeline = start_run(tmp_path)
        target = delta_commits(tmp_path) + rng.randint(2, 12)
        deadline = time.monotonic() + 600
        while pipeline.poll() is None and delta_commits(tmp_path) < target:
            assert time.monotonic() < deadline, "the pipeline made no progress"
            time.sleep(0.05)
        time.sleep(rng.uniform(0, 2))
        if pipeline.poll() is None:
            pipeline.send_signal(signal.SIGKILL)
            kills += 1
        pipeline.communicate(timeout=120)
    final = run(tmp_path)
    assert kills >= 1
    assert_matches_ground_truth(final, truth)
    assert_exactly_once(tmp_path, truth)


def test_a_work_unit_failed_for_good_then_an_output_file_lost_are_each_recovered(tmp_path):
    """Photon §3.3.3: ids registered by a work unit that never wrote its output (it crashed after
    the commit, and is not retried: max_attempts 1) are found by verification, unregistered and
    joined again by the recovery job; the failed work unit is then made good. Then a data file of
    joined_clicks is deleted behind the pipeline's back: the next run finds the storage loss before
    anything else and joins the clicks it held again."""
    truth = generate(tmp_path)
    settings = {"PHOTON_SETTINGS": json.dumps({"max_attempts": 1})}
    # The queries first, alone: a query run in flight when the click run's process is killed would
    # fail for good too (max_attempts 1), and a query unit failed for good needs a human.
    clicks, held = tmp_path / "logs" / "dc1" / "click", tmp_path / "held_clicks"
    clicks.rename(held)
    clicks.mkdir()
    queries_only = run(tmp_path, env_extra=settings)
    assert queries_only["failed_work_units"] == [], queries_only
    clicks.rmdir()
    held.rename(clicks)
    killed = photon("run", "--data-dir", str(tmp_path), "--until-idle",
                    env_extra={"PHOTON_FAULT": "after_registry_commit:kill", **settings})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]

    recovered = run(tmp_path, env_extra=settings)
    recovery = recovered["recoveries"][0]
    assert recovery["lost_ids"] > 0 and recovery["reinjected"] == recovery["lost_ids"] + recovery["untracked"]
    assert len(recovery["recovered_work_units"]) == 1
    assert_matches_ground_truth(recovered, truth)
    assert_exactly_once(tmp_path, truth)

    table = tmp_path / "warehouse" / "joined_clicks"
    files = sorted(table.glob("*.parquet"), key=lambda p: p.stat().st_size)
    lost = len(DeltaTable(str(table)).to_pyarrow_table(columns=["click_id"]).column("click_id"))
    files[-1].unlink()

    final = run(tmp_path)
    recovery = final["recoveries"][0]
    assert recovery["missing_files"]["joined_clicks"] == 1
    assert 0 < recovery["reinjected"] == recovery["lost_ids"] <= lost
    assert recovery["without_source"] == 0
    assert_matches_ground_truth(final, truth)
    assert_exactly_once(tmp_path, truth)


def tailer_pids(data_dir: Path) -> set[int]:
    """The query tailers (photon/query_tail.py) serving `data_dir`, by their command lines."""
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            command = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"event-store" in command and b"tail" in command and str(data_dir).encode() in command:
            found.add(int(cmdline.parent.name))
    return found


def test_the_query_tailer_killed_mid_stream_is_restarted_and_every_click_joins_once(tmp_path):
    """kill -9 of the query tailer while `photon gen --follow` writes and `photon run` tails: photon run
    starts another, which goes on from the offsets the registry service holds; every joinable click
    is joined once."""
    writer = subprocess.Popen([*PHOTON, "gen", "--data-dir", str(tmp_path), "--follow", "--rate", "40",
                               "--duration-s", "25", "--seed", "17"], cwd=REPO_ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pipeline = None
    try:
        while not (tmp_path / "logs" / "dc1" / "query").is_dir():
            assert writer.poll() is None, writer.stderr.read()
            time.sleep(0.1)
        pipeline = start_run(tmp_path, "--min-seconds", "45")
        mirror = tmp_path / "state" / "streams" / "dc1" / "query_tail.json"
        deadline = time.monotonic() + 120
        while not (mirror.exists() and json.loads(mirror.read_text())["part"] >= 3 and tailer_pids(tmp_path)):
            assert pipeline.poll() is None and time.monotonic() < deadline, "the query tailer did not start"
            time.sleep(0.2)
        killed = tailer_pids(tmp_path)
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        while not tailer_pids(tmp_path) - killed:
            assert pipeline.poll() is None and time.monotonic() < deadline, "the query tailer was not restarted"
            time.sleep(0.2)
        assert writer.wait(timeout=120) == 0
        out, err = pipeline.communicate(timeout=900)
        assert pipeline.returncode == 0, err[-3000:]
    finally:
        for process in (writer, pipeline):
            if process is not None and process.poll() is None:
                process.kill()
    assert "the query tailer of dc1 exited with status -9; restarting it" in err
    truth = json.loads((tmp_path / "gen_summary.json").read_text())
    assert_matches_ground_truth(json.loads(out.strip().splitlines()[-1]), truth)
    assert_exactly_once(tmp_path, truth)
    assert tailer_pids(tmp_path) == set()  # stopped with photon run
