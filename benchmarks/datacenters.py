"""Two datacenters, one registry: wasted joins, failover, and catch-up after an outage.

1. Both at once: the default two-datacenter workload (`photon gen --datacenters dc1,dc2`), one
   registry server, and one `photon run` per datacenter started together, as two datacenters'
   pipelines would be. Reported per datacenter: clicks looked up, skipped at the dispatcher lookup
   (registered by the other), joined, wasted joins (joined, then refused by the registry) and its
   share of the joins; `wasted_join_share` is Photon's "events processed by both joiners" (under
   5 % in the paper; resources/registry/ownership.py keeps it near 0).
2. Failover: live logs (`photon gen --follow`, files rotated every 32 KiB so both datacenters
   always have a share), both datacenters tailing them; dc2's `photon run` is SIGKILLed (with its
   process group: its event-store tailer and JVM) a while
   after it finished its first work unit. dc1 takes over dc2's share when dc2's lease lapses.
   `takeover_seconds`: from the kill to the end of dc1's first work unit on a file of dc2's
   share. Then dc2 comes back (its killed runs are retried) and the output is checked against the
   generator's ground truth: every joinable click once.
3. Outage and catch-up (Photon Figure 13): the same workload with replication to dc2 stopped
   (`--replication-lag dc2=inf`); dc1 processes the whole backlog alone; replication resumes
   (`photon replicate --to dc2`) and dc2 catches up through the same backlog, skipping the ranges
   dc1 finished without reading them. `catch_up_speedup`: dc1's time over dc2's. Then dc2 once more
   with nothing to do: the floor of any catch-up (`catch_up_speedup_ceiling`).
4. A live outage (`live_outage`): `photon gen --follow` at `--rate` clicks/s into both replicas, a
   `photon run` per datacenter; dc2's is SIGKILLed after `--outage-after` seconds, at the first moment
   one of its click runs is under way (`interrupted_click_run`), and started again
   `--outage-seconds` later, while its logs kept arriving (dc1 takes its share over meanwhile). The
   backlog is the click lines dc2's logs received while it was down; dc2 has caught up when its
   dispatcher has cut (or skipped, as done by dc1) every byte its click logs held when it came back,
   and each of its own work units among them is done in the registry. `catch_up_rate_multiple`:
   backlog clicks per second of catch-up, over the live click rate. Then the output against the
   generator's truth: every joinable click once.

5. The loss of a registry machine (`registry_loss`): the same live two-datacenter workload on the
   replicated registry (`photon registry serve --replicas 3`, each datacenter's `photon run` preferring
   its own replica: dc1 replica-1, dc2 replica-2); after `--outage-after` seconds the machine of the
   replica dc1 uses is lost: replica-1 and etcd member 1 SIGKILLed, their directories deleted. The
   serving process replaces the member and rebuilds the replica from a live one's snapshot
   (`replica_rebuilt_seconds`); dc1's runs go on against replica-2 meanwhile, its memory tier lost
   and fed again by its tailer. The backlog is the click lines dc1's logs received from the loss until
   replica-1 served again; `catch_up_rate_multiple`: those clicks per second of dc1's catch-up (until
   its dispatcher cut every byte its logs held then, each unit done), over the live rate. Then every
   joinable click once, and the replicas' id sets equal.

Each run's stderr is in `photon-run-<dc>-<n>.log` of its data directory (`--work-dir` keeps them).

    python benchmarks/datacenters.py [--parts both,failover,outage,live-outage,registry-loss] [--rate 1000 --outage-seconds 600]

Writes benchmarks/results/<date>-datacenters-<commit>.json and prints a summary.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PHOTON = [sys.executable, "-m", "photon.cli"]

from benchmarks.result_file import ResultFile  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(*args: str) -> None:
    out = subprocess.run([*PHOTON, *args], cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"photon {' '.join(args)} failed: {out.stderr.strip()[-500:]}")


# Every `photon run` started, so that a part that fails stops the others (a failed dc1 once left
# dc2 running for minutes against a stopped registry).
RUNS: list[subprocess.Popen] = []


def start_run(data_dir: Path, dc: str, address: str, *extra: str) -> tuple[subprocess.Popen, float]:
    """`photon run --until-idle` of one datacenter against the registry at `address`, in a process
    group of its own (its event-store tailer and JVM go with it), its stderr in a log file of the data
    directory (a pipe nobody reads for minutes fills and stops the run)."""
    env = {**os.environ, "PHOTON_REGISTRY_ADDRESS": address}
    log = data_dir / f"photon-run-{dc}-{len(RUNS)}.log"
    with open(log, "wb") as err:
        process = subprocess.Popen([*PHOTON, "run", "--data-dir", str(data_dir), "--until-idle", "--json",
                                    "--datacenters", dc, *extra], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                   stderr=err, text=True, start_new_session=True)
    process.log = log
    RUNS.append(process)
    return process, time.monotonic()


def stderr_tail(process: subprocess.Popen) -> str:
    return process.log.read_text(errors="replace").strip()[-4000:]


def kill_datacenter(process: subprocess.Popen) -> None:
    """SIGKILL to a run's whole process group: the datacenter goes down at once."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.communicate()


def kill_during_click_run(data: Path, process: subprocess.Popen, dc: str, timeout_s: float = 60.0) -> str | None:
    """`kill_datacenter` while one of `dc`'s click runs is under way (its staging directory exists), so
    that every outage interrupts a click unit, whose retry the catch-up then waits for: the same hard
    case in every run, not wherever the clock lands. Returns that unit's staging directory's name (None:
    no click run within `timeout_s`; killed anyway)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        under_way = sorted((data / "staging").glob(f"{dc}.click.*.a*"))
        if under_way:
            kill_datacenter(process)
            return under_way[0].name
        time.sleep(0.02)
    kill_datacenter(process)
    return None


def stop_runs() -> None:
    for process in RUNS:
        if process.poll() is None:
            kill_datacenter(process)


def finish(process: subprocess.Popen, started: float) -> dict:
    out, _ = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"photon run failed: {stderr_tail(process)}")
    summary = json.loads(out.strip().splitlines()[-1])
    summary["process_seconds"] = round(time.monotonic() - started, 2)
    return summary


class Registry:
    def __init__(self, data_dir: Path):
        ready = data_dir / "registry.ready"
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        self.log = open(data_dir / "registry-bench.log", "ab")
        self.process = subprocess.Popen([*PHOTON, "registry", "serve", "--data-dir", str(data_dir), "--port", str(port),
                                         "--ready-file", str(ready)], cwd=REPO, stdout=self.log, stderr=self.log)
        while not ready.exists():
            if self.process.poll() is not None:
                raise SystemExit("the registry server did not start")
            time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait()
        self.log.close()


def dc_row(summary: dict, dc: str) -> dict:
    joiner = summary["joiner_by_dc"][dc]
    return {
        "dc": dc,
        "wall_seconds": summary["wall_seconds"],
        "runs": summary["runs"],
        "clicks_looked_up": joiner["clicks"],
        "skipped_registered": joiner["skipped_registered"],
        "joined": joiner["joined"],
        "wasted_joins": joiner["refused"],
        "checks_passed": all(summary["verification"].values()),
        "run_median_seconds": {kind: cost.get("median_seconds") for kind, cost in summary.get("run_cost", {}).items()},
    }


def both_at_once(work: Path, gen: list[str]) -> dict:
    data = work / "both"
    command("gen", "--data-dir", str(data), *gen)
    registry = Registry(data)
    try:
        started = time.monotonic()
        runs = [start_run(data, dc, registry.address) for dc in ("dc1", "dc2")]
        rows = [dc_row(finish(*run), dc) for run, dc in zip(runs, ("dc1", "dc2"))]
        wall = round(time.monotonic() - started, 2)
    finally:
        stop_runs()
        registry.stop()
    joined = sum(r["joined"] for r in rows)
    wasted = sum(r["wasted_joins"] for r in rows)
    for row in rows:
        row["join_share"] = round(row["joined"] / joined, 3) if joined else None
    return {"datacenters": rows, "wall_seconds": wall, "joined_total": joined, "wasted_joins_total": wasted,
            "wasted_join_share": round(wasted / (joined + wasted), 4) if joined + wasted else None}


def claims(data: Path, address: str, dc: str = "dc1") -> list[dict]:
    """Every claim on `dc`'s click files (resources/registry/work_claims.py), from the registry."""
    from resources.registry.client import RemoteIdRegistry

    files = sorted(click_sizes(data, dc))
    registry = RemoteIdRegistry(address)
    try:
        return registry.work_claims("click", files)
    finally:
        registry.close()


def failover(work: Path, seed: int, seconds: float, kill_after: float) -> dict:
    from deltalake import DeltaTable

    from resources.registry.ownership import preferred_dc

    data = work / "failover"
    gen = subprocess.Popen([*PHOTON, "gen", "--data-dir", str(data), "--follow", "--rate", "100", "--duration-s",
                            str(seconds), "--seed", str(seed), "--datacenters", "dc1,dc2", "--rotate-bytes", "32768"],
                           cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while not (data / "logs" / "dc1" / "click").is_dir():
        if gen.poll() is not None:
            raise SystemExit(f"photon gen failed: {gen.stderr.read()[-500:]}")
        time.sleep(0.1)
    registry = Registry(data)
    try:
        dc1 = start_run(data, "dc1", registry.address, "--min-seconds", str(seconds))
        dc2, _ = start_run(data, "dc2", registry.address, "--min-seconds", str(seconds))
        deadline = time.monotonic() + 600
        while not any(c["dc"] == "dc2" and c["state"] != "claimed" for c in claims(data, registry.address)):
            if dc2.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("dc2 finished no work unit to be killed after")
            time.sleep(0.2)
        time.sleep(kill_after)
        kill_datacenter(dc2)
        killed_us = time.time_ns() // 1000
        if gen.wait() != 0:
            raise SystemExit(f"photon gen failed: {gen.stderr.read()[-500:]}")
        survivor = dc_row(finish(*dc1), "dc1")
        taken = [c for c in claims(data, registry.address) if c["dc"] == "dc1" and c["claimed_us"] > killed_us
                 and preferred_dc(c["file"], {"dc1", "dc2"}) == "dc2" and c["finished_us"]]
        if not taken:
            raise SystemExit("dc1 never took over dc2's share")
        back = dc_row(finish(*start_run(data, "dc2", registry.address)), "dc2")
    finally:
        stop_runs()
        registry.stop()
    truth = json.loads((data / "gen_summary.json").read_text())
    ids = DeltaTable(str(data / "warehouse" / "joined_clicks")).to_pyarrow_table(columns=["click_id"]).column(0).to_pylist()
    return {
        "takeover_seconds": round((min(c["finished_us"] for c in taken) - killed_us) / 1e6, 2),
        "takeover_first_claim_seconds": round((min(c["claimed_us"] for c in taken) - killed_us) / 1e6, 2),
        "bytes_taken_over": sum(c["end"] - c["start"] for c in taken),
        "survivor": survivor,
        "killed_one_back": back,
        "no_click_twice": len(ids) == len(set(ids)),
        "every_joinable_click_joined": set(ids) == set(truth["joinable_click_ids"]),
    }


def outage_and_catch_up(work: Path, gen: list[str]) -> dict:
    data = work / "outage"
    command("gen", "--data-dir", str(data), *gen, "--replication-lag", "dc2=inf")
    registry = Registry(data)
    try:
        first = dc_row(finish(*start_run(data, "dc1", registry.address)), "dc1")
        command("replicate", "--data-dir", str(data), "--to", "dc2")
        catch_up = dc_row(finish(*start_run(data, "dc2", registry.address)), "dc2")
        # The floor of a catch-up: `photon run` with nothing left to do (start, passes, verification).
        idle = dc_row(finish(*start_run(data, "dc2", registry.address)), "dc2")
    finally:
        stop_runs()
        registry.stop()
    return {
        "backlog_first_time": first,
        "catch_up": catch_up,
        "catch_up_ratio": round(catch_up["wall_seconds"] / first["wall_seconds"], 3),
        "catch_up_speedup": round(first["wall_seconds"] / catch_up["wall_seconds"], 2),
        "idle_run": idle,
        "catch_up_speedup_ceiling": round(first["wall_seconds"] / idle["wall_seconds"], 2),
        "catch_up_skipped_share": round(catch_up["skipped_registered"] / catch_up["clicks_looked_up"], 4)
        if catch_up["clicks_looked_up"] else None,
    }


def click_sizes(data: Path, dc: str) -> dict[str, int]:
    """The size of each of `dc`'s click log files now."""
    root = data / "logs" / dc / "click"
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*.jsonl")}


def lines_between(data: Path, dc: str, before: dict[str, int], after: dict[str, int]) -> int:
    """Complete lines appended to `dc`'s click files between two `click_sizes`."""
    root, lines = data / "logs" / dc / "click", 0
    for file, end in after.items():
        with open(root / file, "rb") as f:
            at = f.seek(before.get(file, 0))
            while at < end:  # in blocks: ten minutes of clicks are hundreds of MB
                block = f.read(min(16 << 20, end - at))
                lines, at = lines + block.count(b"\n"), at + len(block)
    return lines


def caught_up(data: Path, dc: str, sizes: dict[str, int], address: str) -> bool:
    """Whether `dc`'s dispatcher cut or skipped every byte of `sizes`, and each of its units among
    them is done in the registry."""
    from resources.state.layout import DataLayout
    from resources.state.work_unit_log import WorkUnitLog

    log = WorkUnitLog.load(DataLayout(data).work_unit_log(dc, "click"))
    offsets = log.next_offsets()
    if any(offsets.get(file, 0) < size for file, size in sizes.items()):
        return False
    ours = {u.id for u in log.units if u.dispatched and any(start < sizes.get(f, 0) for f, start, _ in u.ranges)}
    done = {c["unit"] for c in claims(data, address, dc) if c["state"] != "claimed"}
    return ours <= done


def live_outage(work: Path, seed: int, rate: float, before: float, outage: float, after: float) -> dict:
    from deltalake import DeltaTable

    data = work / "live-outage"
    total = before + outage + after
    gen = subprocess.Popen([*PHOTON, "gen", "--data-dir", str(data), "--follow", "--rate", str(rate), "--duration-s",
                            str(total), "--seed", str(seed), "--datacenters", "dc1,dc2", "--rotate-bytes", str(1 << 20)],
                           cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while not (data / "logs" / "dc2" / "click").is_dir():
        if gen.poll() is not None:
            raise SystemExit(f"photon gen failed: {gen.stderr.read()[-500:]}")
        time.sleep(0.1)
    started = time.monotonic()
    registry = Registry(data)
    try:
        dc1 = start_run(data, "dc1", registry.address, "--min-seconds", str(total))
        dc2, _ = start_run(data, "dc2", registry.address, "--min-seconds", str(total))
        time.sleep(max(0.0, before - (time.monotonic() - started)))
        if dc2.poll() is not None:
            raise SystemExit(f"dc2 ended before its outage: {stderr_tail(dc2)}")
        interrupted = kill_during_click_run(data, dc2, "dc2")
        down = click_sizes(data, "dc2")
        time.sleep(outage)
        back = click_sizes(data, "dc2")
        backlog = lines_between(data, "dc2", down, back)
        dc2, restarted = start_run(data, "dc2", registry.address, "--min-seconds",
                                   str(max(0.0, total - (time.monotonic() - started))))
        while not caught_up(data, "dc2", back, registry.address):
            if dc2.poll() is not None:
                raise SystemExit(f"dc2 ended before it caught up: {stderr_tail(dc2)}")
            time.sleep(0.5)
        catch_up_seconds = time.monotonic() - restarted
        if gen.wait() != 0:
            raise SystemExit(f"photon gen failed: {gen.stderr.read()[-500:]}")
        rows = [dc_row(finish(*dc1), "dc1"), dc_row(finish(dc2, restarted), "dc2")]
    finally:
        stop_runs()
        registry.stop()
    truth = json.loads((data / "gen_summary.json").read_text())
    ids = DeltaTable(str(data / "warehouse" / "joined_clicks")).to_pyarrow_table(columns=["click_id"]).column(0).to_pylist()
    per_second = backlog / catch_up_seconds
    return {
        "rate_clicks_per_second": rate, "outage_seconds": outage, "backlog_clicks": backlog,
        "interrupted_click_run": interrupted,
        "catch_up_seconds": round(catch_up_seconds, 2), "catch_up_clicks_per_second": round(per_second, 1),
        "catch_up_rate_multiple": round(per_second / rate, 2), "datacenters": rows,
        "no_click_twice": len(ids) == len(set(ids)),
        "every_joinable_click_joined": set(ids) == set(truth["joinable_click_ids"]),
    }


class ReplicatedRegistry:
    """`photon registry serve --replicas 3` on the data directory, once it prints its replicas."""

    def __init__(self, data_dir: Path):
        self.log = open(data_dir / "registry-bench.log", "ab")
        self.process = subprocess.Popen([*PHOTON, "registry", "serve", "--data-dir", str(data_dir), "--replicas", "3"],
                                        cwd=REPO, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                        start_new_session=True)
        line = self.process.stdout.readline()
        if not line.startswith("photon registry: replicas at "):
            raise SystemExit(f"the replicated registry did not start: {line!r}")
        self.replicas = line.split("replicas at ", 1)[1].split(";", 1)[0].split(",")

    def preferring(self, n: int) -> str:
        """The replicas' addresses, replica n (from 1) first: a datacenter's processes prefer their own."""
        return ",".join(self.replicas[n - 1:] + self.replicas[:n - 1])

    def stop(self) -> None:
        from resources.runtime.process_groups import stop_group

        stop_group(self.process, 60)
        self.log.close()


def pid_with(data: Path, marker: str) -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(data) in line and marker in line:
                return int(entry.name)
    return None


def lose_registry_machine(data: Path, n: int) -> None:
    """Replica n and etcd member n SIGKILLed, their directories deleted: machine n is gone."""
    for marker in (f"--name etcd-{n} ", f"--replica replica-{n} "):
        pid = pid_with(data, marker)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(data / "registry" / "etcd" / f"etcd-{n}", ignore_errors=True)
    shutil.rmtree(data / "registry" / f"replica-{n}", ignore_errors=True)


def registry_loss(work: Path, seed: int, rate: float, before: float, after: float) -> dict:
    from deltalake import DeltaTable

    from resources.registry.client import RemoteIdRegistry

    data = work / "registry-loss"
    total = before + after
    gen = subprocess.Popen([*PHOTON, "gen", "--data-dir", str(data), "--follow", "--rate", str(rate), "--duration-s",
                            str(total), "--seed", str(seed), "--datacenters", "dc1,dc2", "--rotate-bytes", str(1 << 20)],
                           cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while not (data / "logs" / "dc2" / "click").is_dir():
        if gen.poll() is not None:
            raise SystemExit(f"photon gen failed: {gen.stderr.read()[-500:]}")
        time.sleep(0.1)
    started = time.monotonic()
    registry = ReplicatedRegistry(data)
    try:
        dc1 = start_run(data, "dc1", registry.preferring(1), "--min-seconds", str(total))
        dc2 = start_run(data, "dc2", registry.preferring(2), "--min-seconds", str(total))
        time.sleep(max(0.0, before - (time.monotonic() - started)))
        down, lost_at = click_sizes(data, "dc1"), time.monotonic()
        lose_registry_machine(data, 1)
        ready = data / "registry" / "replica-1" / "ready"
        while not ready.exists():
            if time.monotonic() - lost_at > 600:
                raise SystemExit("replica-1 was not rebuilt within 10 minutes")
            time.sleep(0.2)
        rebuilt_seconds = time.monotonic() - lost_at
        back = click_sizes(data, "dc1")
        backlog = lines_between(data, "dc1", down, back)
        caught_from = time.monotonic()
        while not caught_up(data, "dc1", back, registry.preferring(1)):
            if dc1[0].poll() is not None:
                raise SystemExit(f"dc1 ended before it caught up: {stderr_tail(dc1[0])}")
            time.sleep(0.5)
        catch_up_seconds = time.monotonic() - lost_at
        if gen.wait() != 0:
            raise SystemExit(f"photon gen failed: {gen.stderr.read()[-500:]}")
        rows = [dc_row(finish(*dc1), "dc1"), dc_row(finish(*dc2), "dc2")]
        client = RemoteIdRegistry(registry.preferring(1))
        agreement = client.replicas_agreement()
        client.close()
        rebuilt_log = (data / "state" / "registry-replica-1.log").read_text(errors="replace")
    finally:
        stop_runs()
        registry.stop()
    truth = json.loads((data / "gen_summary.json").read_text())
    ids = DeltaTable(str(data / "warehouse" / "joined_clicks")).to_pyarrow_table(columns=["click_id"]).column(0).to_pylist()
    per_second = backlog / max(catch_up_seconds - rebuilt_seconds, 1e-9) if catch_up_seconds > rebuilt_seconds else None
    return {
        "rate_clicks_per_second": rate, "lost_after_seconds": before,
        "replica_rebuilt_seconds": round(rebuilt_seconds, 2),
        "replica_loaded_a_snapshot": "loaded a snapshot" in rebuilt_log,
        "backlog_clicks": backlog,
        # From the loss until dc1's dispatcher had cut every byte its logs held when replica-1 was back.
        "caught_up_seconds_after_loss": round(catch_up_seconds, 2),
        "catch_up_clicks_per_second": round(per_second, 1) if per_second else None,
        "catch_up_rate_multiple": round(per_second / rate, 2) if per_second else None,
        "datacenters": rows, "replicas": {k: v for k, v in agreement.items() if k != "digests"},
        "replicas_agree": agreement["distinct_id_sets"] == 1 and agreement["replicas_answering"] == 3,
        "no_click_twice": len(ids) == len(set(ids)),
        "every_joinable_click_joined": set(ids) == set(truth["joinable_click_ids"]),
    }


PARTS = ("both", "failover", "outage", "live-outage", "registry-loss")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--failover-seconds", type=float, default=120, help="live logs written for the failover run")
    parser.add_argument("--kill-after", type=float, default=15, help="seconds after dc2's first finished unit")
    parser.add_argument("--results-dir", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"which of {','.join(PARTS)} to run")
    parser.add_argument("--rate", type=float, default=1000, help="live-outage: clicks per second")
    parser.add_argument("--outage-after", type=float, default=120, help="live-outage: seconds before dc2 goes down")
    parser.add_argument("--outage-seconds", type=float, default=600, help="live-outage: how long dc2 is down")
    parser.add_argument("--after-seconds", type=float, default=300, help="live-outage: live logs after dc2 is back")
    parser.add_argument("--work-dir", type=Path, help="keep the data directories and logs here (default: temporary, removed)")
    args = parser.parse_args()
    parts = args.parts.split(",")
    if set(parts) - set(PARTS):
        parser.error(f"--parts: one or more of {','.join(PARTS)}")
    gen = ["--queries", str(args.queries), "--seed", str(args.seed), "--datacenters", "dc1,dc2"]
    name = "datacenters" if parts == list(PARTS) else "datacenters-" + "-".join(parts)
    results = ResultFile("datacenters", name, args.results_dir)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="photon-bench-dc-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        result = {"workload": {"queries": args.queries, "seed": args.seed, "datacenters": ["dc1", "dc2"]}}
        if "both" in parts:
            result["both_at_once"] = both_at_once(work, gen)
            result["wasted_join_share"] = result["both_at_once"]["wasted_join_share"]
        if "failover" in parts:
            result["failover"] = failover(work, args.seed, args.failover_seconds, args.kill_after)
            result["takeover_seconds"] = result["failover"]["takeover_seconds"]
        if "outage" in parts:
            result["outage"] = outage_and_catch_up(work, gen)
            result["catch_up_speedup"] = result["outage"]["catch_up_speedup"]
        if "live-outage" in parts:
            result["live_outage"] = live_outage(work, args.seed, args.rate, args.outage_after, args.outage_seconds,
                                                args.after_seconds)
            result["catch_up_rate_multiple"] = result["live_outage"]["catch_up_rate_multiple"]
        if "registry-loss" in parts:
            result["registry_loss"] = registry_loss(work, args.seed, args.rate, args.outage_after, args.after_seconds)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    out = results.write(result)
    print(json.dumps(result, indent=2))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
