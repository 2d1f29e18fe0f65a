"""IdRegistry service benchmark: commit throughput and latency against a real server process.

For 1 and 4 shards, starts `photon registry serve` on a fresh directory and drives it with 1, 4 and
16 concurrent client processes at 1, 100 and 10,000 fresh ids per commit (same token per client).
Each cell does a fixed amount of work (capped at CELL_SECONDS); per cell it reports commit
requests/s, ids/s, p50/p99 request latency, and from the server's counters the DuckDB transactions
executed with their mean ids and requests (shard requests) per transaction. Writes
benchmarks/results/<date>-registry-<commit>.json and prints a Markdown table.

    .venv/bin/python benchmarks/registry.py
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
    """Commits `requests` batches of fresh ids under one token; returns per-request latencies."""
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


def run_cell(pool, address: str, clients: int, batch: int) -> dict:
    before = pool.apply(server_stats, (address,))
    per_client = max(1, BATCHES[batch] // clients)
    start_at = time.time() + 1.0  # every client has built its payloads by then
    deadline = start_at + CELL_SECONDS
    results = pool.starmap(client, [(address, batch, per_client, start_at, deadline)] * clients, chunksize=1)
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


def main() -> None:
    import resources.registry.service  # noqa: F401  (imported once here, inherited by the forked clients)

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
