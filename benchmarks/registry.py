"""IdRegistry service benchmark: commit throughput and latency against real server processes.

Default: for 1 and 4 shards, starts `photon registry serve` on a fresh directory and drives it with
1, 4 and 16 concurrent client processes at 1, 100 and 10,000 fresh ids per commit (same token per
client). Each cell does a fixed amount of work (capped at CELL_SECONDS); per cell it reports commit
requests/s, ids/s, p50/p99 request latency, and from the server's counters the DuckDB transactions
executed with their mean ids and requests (shard requests) per transaction. Writes
benchmarks/results/<date>-registry-<commit>.json and prints a Markdown table.

`--replicas`: the registry of one machine (`replicas` 1, `registry` "single") beside the replicated
registry (`photon registry serve --replicas N`: N etcd members and N replicas, N 1 and 3), the same
cells; the clients of the replicated registry all prefer its first replica, as the runs of one
`photon run --registry-replicas 3` do (`--spread`: client i prefers replica i mod N, as each
datacenter's processes prefer their own across machines), and a cell's transactions are the log's
entries that carried commits (server-side batching: ids per entry). Writes
`<date>-registry-replicas-<commit>.json`: `configurations`, one per (registry, replicas, ids_per_commit,
clients), with `ids_per_second`, `batch_p50_ms`, `batch_p99_ms`, and the goals' ratios.

    .venv/bin/python benchmarks/registry.py [--replicas]
"""

import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.result_file import ResultFile  # noqa: E402

SHARDS = (1, 4)
CLIENTS = (1, 4, 16)
# Requests per cell, shared by its clients: about the same wall time per cell on 2 cores.
BATCHES = {1: 800, 100: 400, 10_000: 24}
CELL_SECONDS = 15.0

_registries: dict = {}


def _registry(address: str):
    from resources.registry.client import RemoteIdRegistry

    if address not in _registries:
        _registries[address] = RemoteIdRegistry(address)
    return _registries[address]


def server_stats(address: str) -> dict:
    return _registry(address).stats()["total"]


def client(address: str, batch: int, requests: int, start_at: float, deadline: float) -> dict:
    """Commits `requests` batches of fresh ids under one token; returns per-request latencies.
    `address`: HOST:PORT, or a replicated registry's replicas (comma-separated, the preferred first)."""
    import pyarrow as pa

    from resources.registry.shards import now_us

    registry = _registry(address)
    token = f"bench-{uuid.uuid4().hex}"
    ts = now_us()
    payloads = [
        pa.table({"click_id": [f"{token}-{r}-{i}" for i in range(batch)], "timestamp_us": pa.array([ts] * batch, pa.int64())})
        for r in range(requests)
    ]
    time.sleep(max(0.0, start_at - time.time()))
    latencies = []
    for payload in payloads:
        if time.time() > deadline:
            break
        started = time.perf_counter()
        answer = registry.commit(payload, token)
        latencies.append(time.perf_counter() - started)
        assert answer.num_rows == batch
    return {"latencies": latencies, "ids": batch * len(latencies), "ended": time.time()}


def start_server(data_dir: Path, shards: int) -> tuple[subprocess.Popen, str]:
    ready = data_dir / "ready"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("PHOTON_REGISTRY_SECRET", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "photon.cli", "registry", "serve", "--data-dir", str(data_dir), "--port", "0",
         "--shards", str(shards), "--ready-file", str(ready)], cwd=REPO, env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("registry server did not start")
        time.sleep(0.05)
    return process, ready.read_text()


SPREAD = "--spread" in sys.argv[1:]


def spread(address: str, n: int) -> str:
    """Client n's address list: with --spread, the replicas rotated so that client n prefers replica n
    mod N; else as given (every client prefers the first)."""
    replicas = address.split(",")
    k = n % len(replicas) if SPREAD else 0
    return ",".join(replicas[k:] + replicas[:k])


def run_cell(pool, address: str, clients: int, batch: int) -> dict:
    before = pool.apply(server_stats, (address,))
    per_client = max(1, BATCHES[batch] // clients)
    start_at = time.time() + 1.0  # every client has built its payloads by then
    deadline = start_at + CELL_SECONDS
    results = pool.starmap(client, [(spread(address, n), batch, per_client, start_at, deadline) for n in range(clients)],
                           chunksize=1)
    after = pool.apply(server_stats, (address,))
    latencies = sorted(l for r in results for l in r["latencies"])
    elapsed = max(r["ended"] for r in results) - start_at
    transactions = after["transactions"] - before["transactions"]
    return {
        "clients": clients,
        "batch": batch,
        "requests": len(latencies),
        "ids": sum(r["ids"] for r in results),
        "seconds": round(elapsed, 3),
        "requests_per_second": round(len(latencies) / elapsed, 1),
        "ids_per_second": round(sum(r["ids"] for r in results) / elapsed, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 2),
        "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000, 2),
        "transactions": transactions,
        "ids_per_transaction": round((after["ids_in_transactions"] - before["ids_in_transactions"]) / transactions, 1),
        "requests_per_transaction": round(
            (after["requests_in_transactions"] - before["requests_in_transactions"]) / transactions, 2),
    }


def start_replicated(data_dir: Path, replicas: int) -> tuple[subprocess.Popen, str]:
    """`photon registry serve --replicas N` on a fresh directory, once it prints its replicas."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    for name in ("PHOTON_REGISTRY_SECRET", "PHOTON_REGISTRY_ETCD", "PHOTON_REGISTRY_ADDRESS"):
        env.pop(name, None)
    process = subprocess.Popen([sys.executable, "-m", "photon.cli", "registry", "serve", "--data-dir", str(data_dir),
                                "--replicas", str(replicas)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    line = process.stdout.readline()
    if not line.startswith("photon registry: replicas at "):
        raise SystemExit(f"the replicated registry did not start: {line!r}")
    return process, line.split("replicas at ", 1)[1].split(";", 1)[0]


def replicas_main(pool) -> None:
    """`--replicas` (see the module docstring)."""
    from resources.runtime.process_groups import stop_group

    results = ResultFile("registry", "registry-replicas")
    configurations = []
    for registry, replicas in (("single", 1), ("replicated", 1), ("replicated", 3)):
        with tempfile.TemporaryDirectory(prefix="registry-bench-") as tmp:
            process, address = (start_server(Path(tmp), 1) if registry == "single"
                                 else start_replicated(Path(tmp), replicas))
            try:
                for clients in CLIENTS:
                    for batch in BATCHES:
                        cell = run_cell(pool, address, clients, batch)
                        configuration = {"registry": registry, "replicas": replicas, "ids_per_commit": batch,
                                         "clients": clients, "ids_per_second": cell["ids_per_second"],
                                         "batch_p50_ms": cell["p50_ms"], "batch_p99_ms": cell["p99_ms"], **cell}
                        print(json.dumps(configuration), file=sys.stderr)
                        configurations.append(configuration)
            finally:
                if registry == "single":  # in this process's group (start_server)
                    process.terminate()
                    process.wait(timeout=30)
                else:
                    stop_group(process, 30)
    out = results.write({"cell_seconds_cap": CELL_SECONDS, "requests_per_cell": BATCHES,
                         "configurations": configurations, "goals": replicas_goals(configurations)})
    print("| registry | replicas | clients | ids/commit | ids/s | p50 ms | p99 ms | commits per entry (txn) | ids per entry (txn) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in configurations:
        print(f"| {c['registry']} | {c['replicas']} | {c['clients']} | {c['ids_per_commit']} | {c['ids_per_second']} | "
              f"{c['batch_p50_ms']} | {c['batch_p99_ms']} | {c['requests_per_transaction']} | {c['ids_per_transaction']} |")
    print(json.dumps(replicas_goals(configurations), indent=2))
    print(f"\nwritten to {out.relative_to(REPO)}")


def replicas_goals(configurations: list[dict]) -> dict:
    """Issue 71's two goals: three replicas at 10,000 ids a commit at least 40 % of one replica's ids/s
    (the registry of one machine's, and the replicated registry's with one replica), per client count;
    at 100 ids a commit from 16 clients, three replicas faster than the registry of one machine."""
    def rate(registry: str, replicas: int, batch: int, clients: int) -> float | None:
        found = [c["ids_per_second"] for c in configurations if (c["registry"], c["replicas"], c["ids_per_commit"],
                                                                 c["clients"]) == (registry, replicas, batch, clients)]
        return found[0] if found else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a and b else None

    return {
        "three_replicas_at_10000_over_one": {
            str(clients): {"over_single": ratio(rate("replicated", 3, 10_000, clients), rate("single", 1, 10_000, clients)),
                           "over_one_replica": ratio(rate("replicated", 3, 10_000, clients),
                                                     rate("replicated", 1, 10_000, clients))}
            for clients in CLIENTS},
        "three_replicas_at_100_from_16_clients_over_single": ratio(rate("replicated", 3, 100, 16), rate("single", 1, 100, 16)),
    }


def main() -> None:
    import resources.registry.service  # noqa: F401  (imported once here, inherited by the forked clients)

    if "--replicas" in sys.argv[1:]:
        pool = multiprocessing.get_context("fork").Pool(max(CLIENTS))
        try:
            replicas_main(pool)
        finally:
            pool.terminate()
        return

    # Forked before this process opens any gRPC channel (it never does: workers talk to the server).
    results = ResultFile("registry")
    pool = multiprocessing.get_context("fork").Pool(max(CLIENTS))
    cells = []
    try:
        for shards in SHARDS:
            with tempfile.TemporaryDirectory(prefix="registry-bench-") as tmp:
                process, address = start_server(Path(tmp), shards)
                try:
                    for clients in CLIENTS:
                        for batch in BATCHES:
                            cell = {"shards": shards, **run_cell(pool, address, clients, batch)}
                            print(json.dumps(cell), file=sys.stderr)
                            cells.append(cell)
                finally:
                    process.terminate()
                    process.wait(timeout=30)
    finally:
        pool.terminate()
    out = results.write({"cell_seconds_cap": CELL_SECONDS, "requests_per_cell": BATCHES, "cells": cells})
    print("| shards | clients | ids/request | requests | req/s | ids/s | p50 ms | p99 ms | transactions | ids/txn | requests/txn |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in cells:
        print(f"| {c['shards']} | {c['clients']} | {c['batch']} | {c['requests']} | {c['requests_per_second']} | "
              f"{c['ids_per_second']} | {c['p50_ms']} | {c['p99_ms']} | {c['transactions']} | "
              f"{c['ids_per_transaction']} | {c['requests_per_transaction']} |")
    print(f"\nwritten to {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
