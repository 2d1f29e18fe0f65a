"""The IdRegistry as a service (Photon §2.1): an Arrow Flight server around `ShardedIdRegistry`, and
`RemoteIdRegistry`, its client (resources/registry/client.py).

Why Arrow Flight rather than plain gRPC: id batches are Arrow record batches at both ends (Spark
stages them as Parquet, DuckDB answers in Arrow), and Flight moves record batches over gRPC without
per-row serialisation; it also ships in the pyarrow wheel we already depend on.

Protocol:
- commit, lookup, delete: `do_exchange`; the descriptor command is JSON ({"op": "commit", "token":
  ...}), the client streams the (click_id, timestamp_us) batch and the server answers with the
  result table (delete: one row, column `deleted`). grant_clicks (the per-query click cap) likewise,
  with a (query_id, wanted) batch and {"token", "cap"}; the EventStore's memory tier too:
  remember_queries with a batch of query lines and where they lie (recent_queries.PIECE_SCHEMA),
  answered with one row of counts, and recall_queries with a (query_id) batch, answered with those
  held, in the same schema.
- clear_tokens, stats, reshard, gc, work ownership (heartbeat, claim_work, finish_work,
  work_claims) and queries_horizon: `do_action` with JSON bodies, answered with one JSON result.
- scan: `do_get` (any ticket), a stream of every registered id.

The RPC handler threads only enqueue work on the shards' registry threads and wait for the answer,
as in Photon's Figure 3. With a shared secret, every call must carry `authorization: Bearer <secret>`.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from resources.event_store.memory_tier import Holding
from resources.registry.client import first_line
from resources.registry.shards import RegistryClosed, ShardedIdRegistry

log = logging.getLogger(__name__)


class _SharedSecret(flight.ServerMiddlewareFactory):
    def __init__(self, secret: str):
        self._expected = f"Bearer {secret}"

    def start_call(self, info, headers):
        offered = headers.get("authorization", [])
        if not any(hmac.compare_digest(str(value), self._expected) for value in offered):
            raise flight.FlightUnauthenticatedError("registry: missing or wrong shared secret")
        return None


class RegistryServer(flight.FlightServerBase):
    """Serves a `ShardedIdRegistry` over Arrow Flight; it listens from construction on."""

    def __init__(self, registry: ShardedIdRegistry, host: str = "127.0.0.1", port: int = 0,
                 secret: str | None = None):
        middleware = {"auth": _SharedSecret(secret)} if secret else {}
        super().__init__(f"grpc://{host}:{port}", middleware=middleware)
        self.registry = registry
        self.host = host

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def do_exchange(self, context, descriptor, reader, writer):
        command = _json(descriptor.command)
        events = reader.read_all()
        op = command.get("op")
        with _as_flight_errors():
            if op == "commit":
                result = self.registry.commit(events, command.get("token") or "")
            elif op == "lookup":
                result = self.registry.lookup(events)
            elif op == "delete":
                result = pa.table({"deleted": pa.array([self.registry.delete(events)], pa.int64())})
            elif op == "grant_clicks":
                result = self.registry.grant_clicks(events, command.get("token") or "", int(command.get("cap") or 0))
            elif op == "remember_queries":
                counts = self.registry.remember_queries(
                    command["dc"], command["unit"], int(command["attempt"]), int(command["part"]), events,
                    command.get("ingested_before_ts"), Holding.of(command))
                result = pa.table({k: pa.array([v], pa.int64()) for k, v in counts.items()})
            elif op == "remember_tailed":
                counts = self.registry.remember_tailed(command["dc"], events, command["tail"])
                result = pa.table({k: pa.array([v], pa.int64()) for k, v in counts.items()})
            elif op == "recall_queries":
                result = self.registry.recall_queries(command["dc"], events)
            else:
                raise ValueError(f"unknown exchange op {op!r} (commit, lookup, delete, grant_clicks, "
                                 "remember_queries, remember_tailed, recall_queries)")
        writer.begin(result.schema)
        writer.write_table(result)

    def do_action(self, context, action):
        body = _json(action.body.to_pybytes() if action.body is not None else b"")
        with _as_flight_errors():
            if action.type == "clear_tokens":
                result: Any = self.registry.clear_tokens(body["token"])
            elif action.type == "stats":
                result = self.registry.stats()
            elif action.type == "counters":
                result = self.registry.counters()
            elif action.type == "reshard":
                result = self.registry.reshard(int(body["shards"]), body.get("effective_at_us"))
            elif action.type == "gc":
                result = self.registry.collect_garbage()
            elif action.type == "heartbeat":
                result = self.registry.heartbeat(body.get("dc"), float(body["ttl_seconds"]))
            elif action.type == "claim_work":
                result = self.registry.claim_work(body["dc"], body["stream"], body["units"])
            elif action.type == "finish_work":
                result = self.registry.finish_work(body["unit"], bool(body["pending"]))
            elif action.type == "work_claims":
                result = self.registry.work_claims(body["stream"], body["files"])
            elif action.type == "queries_horizon":
                result = self.registry.queries_horizon(body["dc"])
            elif action.type == "tail_state":
                result = self.registry.tail_state(body["dc"], bool(body.get("offsets", True)))
            else:
                raise ValueError(f"unknown action {action.type!r} (clear_tokens, stats, counters, reshard, gc, "
                                 "heartbeat, claim_work, finish_work, work_claims, queries_horizon, tail_state)")
        return [json.dumps(result).encode()]

    def list_actions(self, context):
        return [("clear_tokens", "forget a token"), ("stats", "counters and shard configuration"),
                ("reshard", "change the shard count from a time on"), ("gc", "run one GC pass"),
                ("heartbeat", "renew a datacenter's lease; every lease"), ("claim_work", "record cut work units"),
                ("finish_work", "mark a work unit done"), ("work_claims", "claims on log files"),
                ("queries_horizon", "the newest query time the memory tier may lack"),
                ("tail_state", "where a datacenter's query tailer read to")]

    def do_get(self, context, ticket):
        return flight.RecordBatchStream(self.registry.scan())


def _json(raw: bytes) -> dict:
    try:
        value = json.loads(raw or b"{}")
    except json.JSONDecodeError as error:
        raise pa.ArrowInvalid(f"request is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise pa.ArrowInvalid("request must be a JSON object")
    return value


class _as_flight_errors:
    """Bad requests (ValueError) become INVALID_ARGUMENT; a registry closing under a call becomes
    UNAVAILABLE, which clients retry (against the restarted server)."""

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if isinstance(error, RegistryClosed):
            raise flight.FlightUnavailableError(first_line(error)) from None
        if isinstance(error, (ValueError, KeyError)) and not isinstance(error, pa.ArrowException):
            raise pa.ArrowInvalid(first_line(error)) from None
        return False


def serve(data_dir: Path, host: str = "127.0.0.1", port: int = 0, shards: int = 1,
          gc_threshold_days: float = 3.0, secret: str | None = None, ready_file: Path | None = None) -> None:
    """Serves the registry under `<data_dir>/registry/` until SIGTERM or SIGINT (blocking).

    With `ready_file`, writes the bound "host:port" there atomically once serving, so a parent can
    start the server on port 0 and learn its port."""
    from resources.state.layout import DataLayout

    registry = ShardedIdRegistry(DataLayout(Path(data_dir)).registry_dir, shards=shards,
                                 gc_threshold_days=gc_threshold_days)
    try:
        server = RegistryServer(registry, host, port, secret)
    except BaseException:
        registry.close()
        raise
    # The handler only records the signal: one that takes a lock (threading.Event.set) deadlocks when
    # a second signal interrupts it on the same thread, and a SIGKILLed `photon run` sends a burst:
    # the parent-death signal comes again each time the child is handed to another of its dying
    # threads. The server then never stops, and holds the registry files from the next run.
    stopping: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda received, _frame: stopping.append(received))
    if ready_file is not None:
        partial = Path(f"{ready_file}.partial")
        partial.write_text(server.address)
        os.replace(partial, ready_file)
    log.info("registry serving at %s (data %s, shard configuration %s)", server.address, data_dir,
             registry.configuration())
    while not stopping:
        time.sleep(0.2)
    log.info("registry at %s stopping", server.address)
    server.shutdown()
    registry.close()
