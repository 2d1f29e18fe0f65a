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
- scan: `do_get` (any ticket but "snapshot"), a stream of every registered id.
- A replica of the replicated registry (resources/registry/replica.py) serves the same, and: `health`
  and `digest` actions (is it ready, its applied revision; its id set's digest at a revision), the
  exchange `recall_with_tail` (the three memory-tier reads of one click lookup, from this process),
  and `do_get` of the ticket "snapshot": a copy of its state file, for a replica that catches up.
- Every command may carry `request_id` (kept across the client's retries: a replica applies it once)
  and `min_revision` (the log revision the client last saw: a replica reads at least there); every
  answer carries the revision it reflects (exchanges in their schema's metadata, actions as
  {"value", "revision"}), null from the registry of one machine.

The RPC handler threads only enqueue work on the shards' registry threads (or a replica's proposer)
and wait for the answer, as in Photon's Figure 3. With a shared secret, every call must carry
`authorization: Bearer <secret>`.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import signal
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.flight as flight

from resources.event_store.memory_tier import Holding, TierLost
from resources.registry.api import SECRET_ENV, CallContext, IdRegistry, RegistryUnavailable, serving
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
    """Serves an IdRegistry engine (`ShardedIdRegistry`, or a replica: `ReplicatedIdRegistry`) over
    Arrow Flight; it listens from construction on."""

    def __init__(self, registry: IdRegistry, host: str = "127.0.0.1", port: int = 0,
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
        with _as_flight_errors(), serving(_call_of(command)) as call:
            result = self._exchange(command, events)
        metadata = {b"revision": json.dumps(call.revision).encode(), **(result.schema.metadata or {})}
        result = result.replace_schema_metadata(metadata)
        writer.begin(result.schema)
        writer.write_table(result)

    def _exchange(self, command: dict, events: pa.Table) -> pa.Table:
        registry, op = self.registry, command.get("op")

        def counts(answer: dict) -> pa.Table:
            return pa.table({k: pa.array([v], pa.int64()) for k, v in answer.items()})

        def recall_with_tail() -> pa.Table:
            tail, lines, horizon = registry.recall_with_tail(command["dc"], events)
            return lines.replace_schema_metadata({b"tail": json.dumps(tail).encode(),
                                                  b"horizon": json.dumps(horizon).encode()})

        exchanges = {
            "commit": lambda: registry.commit(events, command.get("token") or ""),
            "lookup": lambda: registry.lookup(events),
            "delete": lambda: pa.table({"deleted": pa.array([registry.delete(events)], pa.int64())}),
            "grant_clicks": lambda: registry.grant_clicks(events, command.get("token") or "", int(command.get("cap") or 0)),
            "remember_queries": lambda: counts(registry.remember_queries(
                command["dc"], command["unit"], int(command["attempt"]), int(command["part"]), events,
                command.get("ingested_before_ts"), Holding.of(command))),
            "remember_tailed": lambda: counts(registry.remember_tailed(command["dc"], events, command["tail"])),
            "recall_queries": lambda: registry.recall_queries(command["dc"], events),
            "recall_with_tail": recall_with_tail,
        }
        if op not in exchanges:
            raise ValueError(f"unknown exchange op {op!r} ({', '.join(exchanges)})")
        return exchanges[op]()

    def do_action(self, context, action):
        body = _json(action.body.to_pybytes() if action.body is not None else b"")
        with _as_flight_errors(), serving(_call_of(body)) as call:
            result = self._action(action.type, body)
        return [json.dumps({"value": result, "revision": call.revision}).encode()]

    def _action(self, kind: str, body: dict) -> Any:
        registry = self.registry
        actions = {
            "clear_tokens": lambda: registry.clear_tokens(body["token"]),
            "stats": registry.stats,
            "counters": registry.counters,
            "reshard": lambda: registry.reshard(int(body["shards"]), body.get("effective_at_us")),
            "gc": registry.collect_garbage,
            "heartbeat": lambda: registry.heartbeat(body.get("dc"), float(body["ttl_seconds"])),
            "claim_work": lambda: registry.claim_work(body["dc"], body["stream"], body["units"]),
            "finish_work": lambda: registry.finish_work(body["unit"], bool(body["pending"])),
            "work_claims": lambda: registry.work_claims(body["stream"], body["files"]),
            "queries_horizon": lambda: registry.queries_horizon(body["dc"]),
            "tail_state": lambda: registry.tail_state(body["dc"], bool(body.get("offsets", True))),
            # A replica's own; the registry of one machine is one ready replica with no log.
            "health": lambda: registry.health() if hasattr(registry, "health") else {"replica": None, "ready": True},
            "digest": lambda: registry.digest(int(body["revision"])) if hasattr(registry, "digest") else None,
        }
        if kind not in actions:
            raise ValueError(f"unknown action {kind!r} ({', '.join(actions)})")
        return actions[kind]()

    def list_actions(self, context):
        return [("clear_tokens", "forget a token"), ("stats", "counters and shard configuration"),
                ("reshard", "change the shard count from a time on"), ("gc", "run one GC pass"),
                ("heartbeat", "renew a datacenter's lease; every lease"), ("claim_work", "record cut work units"),
                ("finish_work", "mark a work unit done"), ("work_claims", "claims on log files"),
                ("queries_horizon", "the newest query time the memory tier may lack"),
                ("tail_state", "where a datacenter's query tailer read to"),
                ("health", "whether a replica is ready, and its applied revision"),
                ("digest", "a replica's id set digest at a revision")]

    def do_get(self, context, ticket):
        if ticket.ticket == b"snapshot" and hasattr(self.registry, "snapshot"):
            with _as_flight_errors():
                copy, revision = self.registry.snapshot()
            return flight.GeneratorStream(SNAPSHOT_SCHEMA.with_metadata({b"revision": str(revision).encode()}),
                                          _snapshot_batches(copy))
        with _as_flight_errors(), serving(CallContext()):
            return flight.RecordBatchStream(self.registry.scan())


SNAPSHOT_SCHEMA = pa.schema([("chunk", pa.binary())])


def _snapshot_batches(copy: Path):
    """The copy's bytes, 4 MiB a batch; the copy is deleted once streamed (or abandoned)."""
    try:
        with open(copy, "rb") as f:
            while block := f.read(4 << 20):
                yield pa.record_batch([pa.array([block], pa.binary())], schema=SNAPSHOT_SCHEMA)
    finally:
        copy.unlink(missing_ok=True)


def _call_of(command: dict) -> CallContext:
    return CallContext(request_id=command.get("request_id"), min_revision=int(command.get("min_revision") or 0))


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
        if isinstance(error, (RegistryClosed, RegistryUnavailable)):
            raise flight.FlightUnavailableError(first_line(error)) from None
        if isinstance(error, TierLost):
            raise flight.FlightServerError(first_line(error)) from None
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
    log.info("registry serving at %s (data %s, shard configuration %s)", server.address, data_dir,
             registry.configuration())
    _until_signalled(server, registry, ready_file, lambda: True)


@dataclass(frozen=True)
class ReplicaServing:
    """Where a replica serves (host, port, the file it writes its address to once ready), with what
    shared secret, and on which etcd with what credentials."""

    endpoints: list[str]
    host: str = "127.0.0.1"
    port: int = 0
    secret: str | None = None
    ready_file: Path | None = None
    credentials: Any = None


def serve_replica(name: str, directory: Path, serving_at: ReplicaServing, gc_threshold_days: float = 3.0) -> None:
    """Serves replica `name` of the replicated registry, its state under `directory`, its log on the
    etcd cluster at `serving_at.endpoints`, until SIGTERM or SIGINT (blocking). The ready file is
    written once it caught up with the log (a snapshot of a live replica first, if the log moved past
    its state). Raises ValueError (one line) when etcd is unreachable within 30 s or refuses the
    credentials, or when a replica off loopback has no shared secret."""
    from resources.registry.client import fetch_snapshot
    from resources.registry.etcd_log import Credentials, Etcd, EtcdLog, EtcdRefused, EtcdUnavailable
    from resources.registry.replica import ReplicaSettings, ReplicatedIdRegistry

    endpoints, host, port, secret = serving_at.endpoints, serving_at.host, serving_at.port, serving_at.secret
    credentials, ready_file = serving_at.credentials, serving_at.ready_file
    if not _loopback(host) and not secret:
        raise ValueError(f"a registry replica serving {host} (off loopback) needs a shared secret: {SECRET_ENV}")
    etcd = Etcd(endpoints, credentials or Credentials())
    try:
        etcd.request("/kv/range", {"key": "AA==", "count_only": True}, deadline_seconds=30.0)
    except EtcdUnavailable:
        raise ValueError(f"etcd at {','.join(urlparse(e).netloc for e in endpoints)} unreachable") from None
    except EtcdRefused as error:
        raise ValueError(str(error)) from None
    engine = ReplicatedIdRegistry(name, directory, EtcdLog(etcd), "", lambda address, path: fetch_snapshot(
        address, path, secret), settings=ReplicaSettings(gc_threshold_days=gc_threshold_days))
    try:
        server = RegistryServer(engine, host, port, secret)
    except BaseException:
        engine.close()
        raise
    engine.address = server.address
    engine.start()
    log.info("registry replica %s serving at %s (state %s, etcd %s)", name, server.address, directory, ",".join(endpoints))
    _until_signalled(server, engine, ready_file, engine.ready.is_set)


def _loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _until_signalled(server: RegistryServer, registry: IdRegistry, ready_file: Path | None,
                     ready: Callable[[], bool]) -> None:
    """Serves until SIGTERM or SIGINT; writes the ready file once `ready()` says so."""
    # The handler only records the signal: one that takes a lock (threading.Event.set) deadlocks when
    # a second signal interrupts it on the same thread, and a SIGKILLed `photon run` sends a burst:
    # the parent-death signal comes again each time the child is handed to another of its dying
    # threads. The server then never stops, and holds the registry files from the next run.
    stopping: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda received, _frame: stopping.append(received))
    written = ready_file is None
    while not stopping:
        if not written and ready():
            partial = Path(f"{ready_file}.partial")
            partial.write_text(server.address)
            os.replace(partial, ready_file)
            written = True
        time.sleep(0.2)
    log.info("registry at %s stopping", server.address)
    server.shutdown()
    registry.close()
