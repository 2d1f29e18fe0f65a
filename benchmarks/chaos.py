"""Randomized fault scenarios, in both modes, each checked against the generator's ground truth.

Each scenario is reproducible from its own seed: a random workload shape from `photon gen`'s options
(late queries, orphan clicks, duplicated lines, bad lines of every class, one or two datacenters,
replication lag, file rotation, small work units), a mode (`photon run`, or `photon up` with its
daemon-driven runs), and one to three faults at random moments:

- `photon run`: SIGKILL of `photon run`, of its registry service, of a query tailer; a stall
  (SIGSTOP, then SIGCONT seconds later) of `photon run`, or of a query tailer (a replica's feed that
  stalls and catches up).
- `photon up`: SIGKILL of a run's process, of the daemon, of the webserver, of the Spark Connect
  server, of the registry service, of a query tailer, of `photon up` itself; SIGTERM of `photon up`
  and a restart; a stalled query tailer.
- On the replicated registry (`--registry-replicas 3`, a share of the scenarios of either mode,
  `--replicated-share`; `photon run` then on a local Spark session half the time): SIGKILL of an etcd
  member (`kill_etcd_member`), of a registry replica (`kill_registry_replica`), the loss of a machine
  (`wipe_registry_replica`: a replica and the etcd member of the same number killed, their directories
  deleted), and two of the three members stopped for 5-20 s (`stall_etcd_majority`); at least one of
  these in each such scenario, beside the mode's own faults.

After the faults it restarts what stopped and lets the deployment reach idle (every joinable click
joined, no run unfinished), stops it, and judges: every joinable click joined exactly once (the set
of ids in joined_clicks equals the generator's, no id twice); every other distinct click pending or
unjoinable (the checks' accounting, with the generator's distinct count); every bad line quarantined
(query lines by each datacenter, click lines by one at least: `quarantine_broken`); `photon check` passes; no process of the scenario left. A failing scenario prints the
command that replays it.

    python benchmarks/chaos.py --scenarios 100 [--seed 1] [--up-every 3]   # scenario i is `photon up` when i % 10 < up-every
    python benchmarks/chaos.py --scenarios 40 --replicated-share 1   # every scenario on the replicated registry
    python benchmarks/chaos.py --scenarios 2 --seed-from-commit --small   # seeds from the commit checked out
    python benchmarks/chaos.py --replay SEED --mode run|up
    python benchmarks/chaos.py --scenarios 100 --max-minutes 90   # starts no scenario after 90 minutes
    python benchmarks/chaos.py --merge A.json B.json --name chaos   # runs on the same product code, as one result

Writes benchmarks/results/<date>-chaos-<commit>.json, again after each scenario: `scenarios`, `scenarios_by_mode`,
`faults_by_kind` (with `seeds_without_a_fault`), `violations` (with `violating_seeds`), `wall_seconds`, and each scenario's record.
`photon run` scenarios are clients of one Spark Connect server the tool starts (a JVM start per
scenario would dominate); `photon up` scenarios start their own, as a deployment does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.rate_curve import require_product_code_of_head  # noqa: E402
from benchmarks.result_file import ResultFile  # noqa: E402
from resources.runtime.process_groups import stop_group  # noqa: E402
from resources.spark.connect_server import SERVER_MARKER  # noqa: E402

PYTHON = sys.executable
RUN_FAULTS = ("kill_photon_run", "kill_registry", "kill_query_tailer", "stall_photon_run", "stall_query_tailer")
UP_FAULTS = ("kill_run_process", "kill_daemon", "kill_webserver", "kill_spark_connect", "kill_registry",
             "kill_query_tailer", "kill_photon_up", "sigterm_photon_up", "stall_query_tailer")
REGISTRY_FAULTS = ("kill_etcd_member", "kill_registry_replica", "wipe_registry_replica", "stall_etcd_majority")
REPLICAS = 3
# What each fault's process is, by its command line (the scenario's own: its data directory, or a
# component's marker under its photon up).
MARKERS = {"registry": "registry serve", "query_tailer": "event-store tail", "daemon": "dagster-daemon",
           "webserver": "dagster-webserver", "spark_connect": SERVER_MARKER}
IDLE_TIMEOUT_SECONDS = 600
MAX_RESTARTS = 6


@dataclass
class Scenario:
    seed: int
    mode: str
    gen_options: list[str]
    settings: dict
    faults: list[tuple[float, str]]  # (seconds after the start, kind)
    replicas: int = 1  # the registry's: 1, the registry of one machine; REPLICAS, the replicated one
    local_spark: bool = False  # a `photon run` scenario on a Spark session of its own, not the shared server
    small: bool = False

    def replay_command(self) -> str:
        share = " --replicated-share 1" if self.replicas > 1 else " --replicated-share 0"
        return f"python benchmarks/chaos.py --replay {self.seed} --mode {self.mode}{share}{' --small' if self.small else ''}"


# Faults land within this many seconds of a scenario's start. `photon up` stays up until the scenario
# drives it to idle, after its faults; `photon run --until-idle` exits once idle, so it keeps tailing
# for the horizon (`--min-seconds`): on 2026-11-30's machine, twice as fast as the earlier ones, a
# 150-query scenario was idle before its `kill_photon_run` at 21.7 s, and nothing was injected.
RUN_HORIZON_SECONDS = 25.0
UP_HORIZON_SECONDS = 45.0
# The replicated registry's faults come after its cluster serves (its members and replicas start in
# ~10 s beside the pipeline's own start).
REPLICATED_START_SECONDS = 15.0


def scenario(seed: int, mode: str, replicated_share: float = 0.0, small: bool = False) -> Scenario:
    """The scenario of `seed` in `mode`: its workload, settings and faults, all drawn from the seed (on
    the replicated registry with probability `replicated_share`; `small`: the smallest workload)."""
    rng = random.Random(seed)
    two = rng.random() < 0.3
    queries = rng.choice([150, 300, 500])
    gen = ["--queries", str(150 if small else queries), "--seed", str(seed),
           "--late-query-share", str(rng.choice([0.0, 0.05, 0.2])),
           "--orphan-click-share", str(rng.choice([0.0, 0.03, 0.1])),
           "--duplicate-click-share", str(rng.choice([0.0, 0.05, 0.15])),
           "--bad-lines", str(rng.choice([0, 4, 12])),
           "--datacenters", "dc1,dc2" if two else "dc1"]
    if rng.random() < 0.4:
        gen += ["--rotate-bytes", str(rng.choice([20_000, 60_000]))]
    if two and rng.random() < 0.5:
        gen += ["--replication-lag", f"dc2={rng.choice([30, 300])}"]
    # A lagging replica's share of the click files is taken over after takeover_grace_seconds: shortened
    # from 120 s so that a scenario reaches idle within its minutes.
    settings = {"click_work_unit_bytes": rng.choice([6_000, 20_000, 80_000]),
                "query_work_unit_bytes": rng.choice([60_000, 300_000]),
                "click_catch_up_work_unit_bytes": 0, "query_catch_up_work_unit_bytes": 0, "takeover_grace_seconds": 20}
    kinds = RUN_FAULTS if mode == "run" else UP_FAULTS
    horizon = RUN_HORIZON_SECONDS if mode == "run" else UP_HORIZON_SECONDS
    faults = sorted((round(rng.uniform(2.0, horizon), 1), rng.choice(kinds)) for _ in range(rng.randint(1, 3)))
    # Drawn after the rest: a seed's workload and first faults are the same with or without replication.
    replicated = rng.random() < replicated_share
    if not replicated:
        return Scenario(seed, mode, gen, settings, faults, small=small)
    # On the replicated registry its own faults, one at least, and the mode's but the single registry's.
    faults = [(at, kind) for at, kind in faults if kind != "kill_registry"]
    faults += [(round(rng.uniform(REPLICATED_START_SECONDS, horizon + REPLICATED_START_SECONDS), 1),
                rng.choice(REGISTRY_FAULTS)) for _ in range(rng.randint(1, 2))]
    return Scenario(seed, mode, gen, settings, sorted(faults), REPLICAS, mode == "run" and rng.random() < 0.5, small)


# -- processes ----------------------------------------------------------------

def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def environ_mentions(pid: int, text: str) -> bool:
    try:
        return text.encode() in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return fields[fields.rindex(")") + 2] != "Z"


def scenario_processes(data_dir: Path) -> list[int]:
    """Every live process of the scenario: its data directory in its command line or environment."""
    mine = os.getpid()
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and int(p.name) != mine
            and alive(int(p.name)) and (str(data_dir) in cmdline(int(p.name)) or environ_mentions(int(p.name), str(data_dir)))]


def find(data_dir: Path, marker: str) -> int | None:
    for pid in scenario_processes(data_dir):
        if marker in cmdline(pid):
            return pid
    return None


def signal_pid(pid: int | None, sig: int) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


# -- the two modes ------------------------------------------------------------

@dataclass
class Deployment:
    """The scenario's `photon run` or `photon up`, restarted as needed."""

    mode: str
    data_dir: Path
    env: dict
    log: Path
    replicas: int = 1
    process: subprocess.Popen | None = None
    restarts: int = 0
    notes: list[str] = field(default_factory=list)

    def command(self) -> list[str]:
        replicated = ["--registry-replicas", str(self.replicas)] if self.replicas > 1 else []
        if self.mode == "run":
            horizon = RUN_HORIZON_SECONDS + (REPLICATED_START_SECONDS if replicated else 0)
            return [PYTHON, "-m", "photon.cli", "run", "--data-dir", str(self.data_dir), "--until-idle",
                    "--min-seconds", str(horizon), "--json", *replicated]
        from resources.spark.connect_server import free_port

        return [PYTHON, "-m", "photon.cli", "up", "--data-dir", str(self.data_dir), "--port", str(free_port()), *replicated]

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(self.command(), cwd=REPO, env=self.env, stdout=subprocess.PIPE, stderr=log,
                                            text=True, start_new_session=True)
        if self.mode == "up":  # its ready line, once the UI answers (or nothing: it exited)
            if not self.process.stdout.readline().startswith("photon up:"):
                self.notes.append(f"photon up did not start (exit {self.process.wait()})")

    def restart_if_stopped(self) -> None:
        if self.process is None or self.process.poll() is not None:
            self.restarts += 1
            if self.restarts > MAX_RESTARTS:
                raise RuntimeError(f"{self.mode} stopped {self.restarts} times")
            self.start()

    def stop(self) -> float:
        """SIGTERM (photon up: to its process group, as systemd does) and the seconds until it exited."""
        started = time.monotonic()
        if self.process is not None and self.process.poll() is None:
            stop_group(self.process, 60)
        return time.monotonic() - started


def inject(kind: str, deployment: Deployment, data_dir: Path, rng: random.Random) -> bool:
    """Injects one fault; False when its target was not there (not counted as injected)."""
    process = deployment.process
    if process is None or process.poll() is not None:
        return False
    if kind in ("kill_photon_run", "kill_photon_up"):
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return True
    if kind == "sigterm_photon_up":
        took = deployment.stop()
        if took > 30:
            deployment.notes.append(f"violation: photon up took {took:.0f} s to stop on SIGTERM")
        return True
    if kind == "stall_photon_run":
        os.killpg(process.pid, signal.SIGSTOP)
        time.sleep(rng.uniform(2, 8))
        os.killpg(process.pid, signal.SIGCONT)
        return True
    if kind == "kill_run_process":
        return signal_pid(run_process_pid(data_dir), signal.SIGKILL)
    if kind in REGISTRY_FAULTS:
        return inject_registry_fault(kind, data_dir, rng)
    target = kind.split("_", 1)[1]
    pid = find(data_dir, MARKERS[target])
    if kind.startswith("stall_"):
        if not signal_pid(pid, signal.SIGSTOP):
            return False
        time.sleep(rng.uniform(3, 10))
        return signal_pid(pid, signal.SIGCONT)
    return signal_pid(pid, signal.SIGKILL)


def inject_registry_fault(kind: str, data_dir: Path, rng: random.Random) -> bool:
    """One of REGISTRY_FAULTS on the scenario's replicated registry (photon/registry_cluster.py)."""
    n = rng.randint(1, REPLICAS)
    member, replica = find(data_dir, f"--name etcd-{n} "), find(data_dir, f"--replica replica-{n} ")
    if kind == "kill_etcd_member":
        return signal_pid(member, signal.SIGKILL)
    if kind == "kill_registry_replica":
        return signal_pid(replica, signal.SIGKILL)
    if kind == "wipe_registry_replica":  # the loss of machine n: its member and its replica, with their disks
        if member is None or replica is None:
            return False
        signal_pid(member, signal.SIGKILL)
        signal_pid(replica, signal.SIGKILL)
        shutil.rmtree(data_dir / "registry" / "etcd" / f"etcd-{n}", ignore_errors=True)
        shutil.rmtree(data_dir / "registry" / f"replica-{n}", ignore_errors=True)
        return True
    stalled = [find(data_dir, f"--name etcd-{m} ") for m in rng.sample(range(1, REPLICAS + 1), 2)]
    if None in stalled:
        return False
    for pid in stalled:
        signal_pid(pid, signal.SIGSTOP)
    time.sleep(rng.uniform(5, 20))
    for pid in stalled:
        signal_pid(pid, signal.SIGCONT)
    return True


def run_process_pid(data_dir: Path) -> int | None:
    """The process of a started pipeline run of the scenario's deployment."""
    import dagster as dg

    from photon.dagster_internals import instance_at
    from photon.run_processes import run_process

    instance = instance_at(data_dir / "dagster")
    for run in instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])):
        found = run_process(instance, run.run_id)
        if found is not None:
            return found[0]
    return None


def drained(data_dir: Path, joinable: int, datacenters: list[str]) -> bool:
    """Idle: every joinable click joined, no run unfinished, and no complete log line of any datacenter
    left uncut (a bad line joins nothing, so the joined count alone would call idle a deployment with
    bad lines still to quarantine: those of a lagging replica's share wait for the takeover)."""
    from benchmarks.run import drained as up_drained
    from photon_assets.work_unit import bytes_behind_log_heads
    from resources.state.layout import DataLayout

    layout = DataLayout(data_dir)
    return up_drained(data_dir, joinable) and not any(
        bytes_behind_log_heads(layout, dc, stream) for dc in datacenters for stream in ("query", "click"))


def drive_to_idle(deployment: Deployment, truth: dict) -> None:
    """After the faults: `photon run` restarted until one run ends idle and verified (exit 0);
    `photon up` restarted if it stopped, until the workload is drained, then stopped."""
    deadline = time.monotonic() + IDLE_TIMEOUT_SECONDS
    if deployment.mode == "run":
        while True:
            deployment.restart_if_stopped()
            remaining = max(1.0, deadline - time.monotonic())
            code = deployment.process.wait(timeout=remaining)
            if code == 0:
                return
            deployment.notes.append(f"photon run exited {code}")
    datacenters = sorted(truth["replicas"]) if isinstance(truth.get("replicas"), dict) else ["dc1"]
    while not drained(deployment.data_dir, truth["joinable_clicks"], datacenters):
        if time.monotonic() > deadline:
            raise RuntimeError("photon up did not drain the workload")
        deployment.restart_if_stopped()
        time.sleep(2)
    stop_seconds = deployment.stop()
    if stop_seconds > 30:
        deployment.notes.append(f"violation: photon up took {stop_seconds:.0f} s to stop")


# -- the verdict ---------------------------------------------------------------

def verdict(data_dir: Path, truth: dict, datacenters: list[str]) -> list[str]:
    """What the scenario broke (empty: nothing)."""
    from deltalake import DeltaTable

    broken = []
    joined = DeltaTable(str(data_dir / "warehouse" / "joined_clicks")).to_pyarrow_table(columns=["click_id"])
    ids = joined["click_id"].to_pylist()
    expected = set(truth["joinable_click_ids"])
    if len(ids) != len(set(ids)):
        broken.append(f"{len(ids) - len(set(ids))} click(s) joined twice")
    if set(ids) != expected:
        broken.append(f"joined set differs: {len(expected - set(ids))} missing, {len(set(ids) - expected)} extra")
    checked = subprocess.run([PYTHON, "-m", "photon.cli", "check", "--data-dir", str(data_dir), "--json"], cwd=REPO,
                             capture_output=True, text=True, timeout=600)
    if checked.returncode != 0:
        broken.append(f"photon check exited {checked.returncode}: {checked.stderr.strip()[-400:]}")
    else:
        checks = {c["name"]: c["metadata"] for c in json.loads(checked.stdout.strip().splitlines()[-1])["checks"]}
        counts = checks["clicks_accounted_for"]
        if counts["distinct_clicks"] != truth["distinct_click_ids"]:
            broken.append(f"{counts['distinct_clicks']} distinct clicks seen, {truth['distinct_click_ids']} generated")
        if counts["pending"] + counts["unjoinable"] != truth["distinct_click_ids"] - truth["joinable_clicks"]:
            broken.append(f"{counts['pending']} pending + {counts['unjoinable']} unjoinable, expected "
                          f"{truth['distinct_click_ids'] - truth['joinable_clicks']}")
    broken += quarantine_broken(data_dir, truth, datacenters)
    time.sleep(2)  # the kernel reaps what a stop killed
    left = scenario_processes(data_dir)
    if left:
        broken.append(f"processes left behind: {[cmdline(pid)[:80] for pid in left]}")
        for pid in left:
            signal_pid(pid, signal.SIGKILL)
    return broken


def quarantine_broken(data_dir: Path, truth: dict, datacenters: list[str]) -> list[str]:
    """Every bad line quarantined: each datacenter reads its own replica's query lines (the EventStore is
    per datacenter), so each quarantines every bad query line; a click line is read by one datacenter,
    or by two when one took over the other's ranges, so the bad click lines quarantined, counted once per
    (file, offset) over all datacenters, are the generator's. `datacenters`: those whose replica is whole."""
    from deltalake import DeltaTable

    path = data_dir / "warehouse" / "quarantined_lines"
    rows = DeltaTable(str(path)).to_pyarrow_table(columns=["dc", "stream", "file", "offset"]).to_pylist() \
        if (path / "_delta_log").is_dir() else []
    bad = truth["bad_lines_by_stream"]
    broken = []
    for dc in datacenters:
        found = sum(1 for r in rows if r["dc"] == dc and r["stream"] == "query")
        if found != bad["query"]:
            broken.append(f"{dc}: {found} bad query lines quarantined, {bad['query']} generated")
    clicks = {(r["file"], r["offset"]) for r in rows if r["stream"] == "click"}
    if len(clicks) != bad["click"]:
        broken.append(f"{len(clicks)} bad click lines quarantined, {bad['click']} generated")
    return broken


@contextlib.contextmanager
def kept_or_temporary(work_dir: Path | None):
    """Where the scenarios' data and logs go: `work_dir`, kept after the run (a violation's data is
    its diagnosis), or a temporary directory removed after it."""
    if work_dir is None:
        with tempfile.TemporaryDirectory() as work:
            yield work
        return
    work_dir.mkdir(parents=True, exist_ok=True)
    yield str(work_dir)


def play(s: Scenario, work: Path, spark_remote: str | None) -> dict:
    """One scenario from start to verdict."""
    data_dir = work / f"chaos-{s.seed}"
    shutil.rmtree(data_dir, ignore_errors=True)  # a replay's, in a kept --work-dir
    started = time.monotonic()
    subprocess.run([PYTHON, "-m", "photon.cli", "gen", "--data-dir", str(data_dir), *s.gen_options], cwd=REPO,
                   check=True, stdout=subprocess.DEVNULL)
    truth = json.loads((data_dir / "gen_summary.json").read_text())
    # A lagging replica holds only part of the lines: its quarantine is not the generator's count.
    datacenters = [dc for dc in s.gen_options[s.gen_options.index("--datacenters") + 1].split(",")
                   if f"{dc}=" not in " ".join(s.gen_options)]
    env = {**os.environ, "PHOTON_SETTINGS": json.dumps(s.settings)}
    env.pop("PHOTON_FAULT", None)
    if s.mode == "run" and spark_remote and not s.local_spark:
        env["PHOTON_SPARK_REMOTE"] = spark_remote
    deployment = Deployment(s.mode, data_dir, env, work / f"chaos-{s.seed}.log", s.replicas)
    rng = random.Random(s.seed * 7919)
    injected: list[str] = []
    record = {"seed": s.seed, "mode": s.mode, "gen_options": s.gen_options, "settings": s.settings,
              "faults_planned": s.faults, "registry_replicas": s.replicas, "local_spark": s.local_spark}
    try:
        deployment.start()
        t0 = time.monotonic()
        for at, kind in s.faults:
            time.sleep(max(0.0, at - (time.monotonic() - t0)))
            if s.mode == "up" or deployment.process.poll() not in (None, 0):  # killed: started again
                deployment.restart_if_stopped()
            if inject(kind, deployment, data_dir, rng):
                injected.append(kind)
        drive_to_idle(deployment, truth)
        broken = verdict(data_dir, truth, datacenters)
    except Exception as error:  # a scenario that cannot finish is a violation too, with its seed
        deployment.stop()
        broken = [f"{type(error).__name__}: {error}"]
        for pid in scenario_processes(data_dir):
            signal_pid(pid, signal.SIGKILL)
    broken += [note for note in deployment.notes if note.startswith("violation")]
    return {**record, "faults_injected": injected, "restarts": deployment.restarts, "notes": deployment.notes,
            "violations": broken, "seconds": round(time.monotonic() - started, 1),
            "reproduce": s.replay_command(), "log": str(deployment.log)}


def shared_spark_connect() -> tuple[subprocess.Popen, str]:
    from resources.spark.connect_server import free_port, server_command, server_environment, wait_until_serving

    port = free_port()
    server = subprocess.Popen(server_command(port), cwd=REPO, env=server_environment(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    remote = f"sc://127.0.0.1:{port}"
    wait_until_serving(remote, server)
    return server, remote


def summary(records: list[dict], wall: float) -> dict:
    violating = [r["seed"] for r in records if r["violations"]]
    return {
        "scenarios": len(records),
        "scenarios_by_mode": dict(Counter(r["mode"] for r in records)),
        "scenarios_on_replicated_registry": dict(Counter(r["mode"] for r in records if r.get("registry_replicas", 1) > 1)),
        "run_scenarios_on_a_local_spark_session": sum(1 for r in records if r.get("local_spark")),
        "faults_by_kind": dict(Counter(kind for r in records for kind in r["faults_injected"])),
        # A fault finds no target when its process already ended (a small `photon run` done early).
        "seeds_without_a_fault": [r["seed"] for r in records if not r["faults_injected"]],
        "violations": sum(len(r["violations"]) for r in records),
        "violating_seeds": violating,
        "wall_seconds": round(wall, 1),
    }


def merge(paths: list[Path]) -> dict:
    """One result of several runs: allowed only when each ran on clean commits whose product code is
    the code checked out now (the seeds must not repeat), so that the result holds for this code."""
    runs = [json.loads(path.read_text()) for path in paths]
    require_product_code_of_head(runs)
    records = [r for run in runs for r in run["records"]]
    seeds = Counter(r["seed"] for r in records)
    if max(seeds.values()) > 1:
        raise SystemExit(f"seeds played twice: {[s for s, n in seeds.items() if n > 1]}")
    # Each run's own plan (a run stopped by --max-minutes played fewer): beside its file, not summed.
    return {"merged_from": [{"file": path.name, "commit": run["commit"], "command": run["command"],
                                     "scenarios_planned": run["scenarios_planned"], "scenarios": len(run["records"])}
                                    for path, run in zip(paths, runs)],
            **summary(records, sum(run["wall_seconds"] for run in runs)), "records": records}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1, help="scenario i has seed SEED + i")
    parser.add_argument("--up-every", type=int, default=3, help="scenario i runs photon up when i %% 10 < this")
    parser.add_argument("--replay", type=int, help="play the one scenario of this seed")
    parser.add_argument("--mode", choices=("run", "up"), help="with --replay: its mode")
    parser.add_argument("--work-dir", type=Path,
                        help="keep each scenario's data and log here (default: a temporary directory, removed)")
    parser.add_argument("--results-dir", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--name", default="chaos", help="the result file's name: <date>-<name>-<commit>.json")
    parser.add_argument("--max-minutes", type=float, default=0, help="start no scenario after this long (0: no limit)")
    parser.add_argument("--merge", type=Path, nargs="+", help="write these results (same product code) as one")
    parser.add_argument("--replicated-share", type=float, default=0.3,
                        help="the share of scenarios on the replicated registry (with its faults)")
    parser.add_argument("--small", action="store_true", help="every scenario on the smallest workload (150 queries)")
    parser.add_argument("--seed-from-commit", action="store_true",
                        help="SEED drawn from the commit checked out (printed): each commit tries other scenarios")
    args = parser.parse_args()
    if args.seed_from_commit:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        args.seed = int(commit[:8] or "0", 16) % 1_000_000
        print(f"seeds from commit {commit[:10]}: {args.seed} to {args.seed + args.scenarios - 1}", flush=True)
    results = ResultFile("chaos", args.name, args.results_dir)
    if args.merge:
        result = merge(args.merge)
        out = results.write(result)
        print(f"written to {out}: {result['scenarios']} scenarios {result['scenarios_by_mode']}, "
              f"{result['violations']} violation(s) {result['violating_seeds']}")
        return
    if args.replay is not None:
        if args.mode is None:
            parser.error("--replay needs --mode")
        plan = [scenario(args.replay, args.mode, args.replicated_share, args.small)]
    else:
        plan = [scenario(args.seed + i, "up" if i % 10 < args.up_every else "run", args.replicated_share, args.small)
                for i in range(args.scenarios)]
    started = time.monotonic()
    server, remote = shared_spark_connect() if any(s.mode == "run" for s in plan) else (None, None)
    records: list[dict] = []
    planned = {"scenarios_planned": len(plan)}
    try:
        with kept_or_temporary(args.work_dir) as work:
            for s in plan:
                if args.max_minutes and time.monotonic() - started > args.max_minutes * 60:
                    print(f"stopping after {len(records)} scenarios: --max-minutes {args.max_minutes} reached", flush=True)
                    break
                records.append(play(s, Path(work), remote))
                r = records[-1]
                state = "ok" if not r["violations"] else "VIOLATION " + "; ".join(r["violations"]) + f" -- {r['reproduce']}"
                print(f"seed {s.seed} {s.mode}: faults {r['faults_injected']} restarts {r['restarts']} "
                      f"{r['seconds']} s: {state}", flush=True)
                if args.replay is None:  # after each scenario: an interrupted run keeps what it found
                    results.write({**planned, **summary(records, time.monotonic() - started), "records": records})
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    result = {**planned, **summary(records, time.monotonic() - started), "records": records}
    if args.replay is None:
        print(f"written to {results.write(result)}")
    print(f"{result['scenarios']} scenarios {result['scenarios_by_mode']}, faults {result['faults_by_kind']}: "
          f"{result['violations']} violation(s) {result['violating_seeds']} in {result['wall_seconds']} s")
    sys.stdout.flush()
    # Not sys.exit: deltalake's runtime threads can abort a normal interpreter exit (status 134).
    os._exit(1 if result["violations"] else 0)


if __name__ == "__main__":
    main()
