"""The IdRegistry as a service (Photon §2.1): an Arrow Flight server around `ShardedIdRegistry`, and
`RemoteIdRegistry`, its client.

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
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.flight as flight

from resources.registry_api import ArrowSource, IdRegistry
from resources.click_caps import WANTED_SCHEMA
from resources.recent_queries import PIECE_SCHEMA
from resources.recent_queries import WANTED_SCHEMA as WANTED_QUERIES
from resources.registry_shards import EVENTS_SCHEMA, RegistryClosed, ShardedIdRegistry, read_arrow

log = logging.getLogger(__name__)



class RegistryUnavailable(ConnectionError):
    """The registry server could not be reached within the client's attempts."""


class RegistryAuthenticationError(PermissionError):
    """The registry server rejected the client's shared secret."""


def parse_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"registry address {address!r} is not HOST:PORT")
    return host, int(port)


def first_line(error: BaseException) -> str:
    """The message of an error, without Flight's ". Detail: ..." suffix and later lines."""
    text = str(error).strip()
    return text.splitlines()[0].split(". Detail: ")[0] if text else type(error).__name__


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
                    command.get("ingested_before_ts"), int(command["latest_valid_ts"]),
                    float(command["retention_seconds"]), int(command["budget_bytes"]))
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
                result = self.registry.tail_state(body["dc"])
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
    from resources.layout import DataLayout

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


TRANSIENT = (flight.FlightUnavailableError, flight.FlightTimedOutError, ConnectionError)


class RemoteIdRegistry(IdRegistry):
    """Client of a registry server. Connects lazily and pickles as (address, secret, settings), so
    Spark executors can each build one cheaply.

    Transient failures (server unavailable, timed out, connection refused or reset) are retried with
    exponential backoff up to `max_attempts` attempts, then raise `RegistryUnavailable`. Retrying a
    commit whose answer was lost is safe: the same token gets its ids back as 'held'."""

    def __init__(self, address: str, secret: str | None = None, timeout_seconds: float = 30,
                 max_attempts: int = 6, backoff_seconds: float = 0.1, max_backoff_seconds: float = 5.0):
        parse_address(address)
        self.address = address
        self.secret = secret
        self.timeout_seconds = timeout_seconds
        self.max_attempts = max(1, max_attempts)
        self.backoff_seconds = backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self._client: flight.FlightClient | None = None
        self._lock = threading.Lock()

    def for_executors(self) -> "RemoteIdRegistry":
        return self

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_client"], state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._client = None
        self._lock = threading.Lock()

    def _connection(self) -> flight.FlightClient:
        with self._lock:
            if self._client is None:
                self._client = flight.FlightClient(f"grpc://{self.address}")
            return self._client

    def _reset(self, client: flight.FlightClient) -> None:
        with self._lock:
            if self._client is client:
                self._client = None
        client.close()

    def _options(self) -> flight.FlightCallOptions:
        headers = [(b"authorization", f"Bearer {self.secret}".encode())] if self.secret else []
        return flight.FlightCallOptions(timeout=self.timeout_seconds, headers=headers)

    def _call(self, call: Callable[[flight.FlightClient, flight.FlightCallOptions], Any]) -> Any:
        delay = self.backoff_seconds
        for attempt in range(1, self.max_attempts + 1):
            client = self._connection()
            try:
                return call(client, self._options())
            except flight.FlightUnauthenticatedError as error:
                raise RegistryAuthenticationError(
                    f"registry at {self.address} rejected the credentials: {first_line(error)}") from None
            except TRANSIENT as error:
                self._reset(client)
                if attempt == self.max_attempts:
                    raise RegistryUnavailable(f"registry at {self.address} unreachable after "
                                              f"{attempt} attempts: {first_line(error)}") from None
                log.warning("registry at %s: attempt %d failed (%s); retrying", self.address, attempt,
                            first_line(error))
                time.sleep(min(delay, self.max_backoff_seconds))
                delay *= 2
            except pa.ArrowInvalid as error:
                raise ValueError(first_line(error)) from None
        raise AssertionError("unreachable")

    def _exchange(self, command: dict, events: ArrowSource, schema: pa.Schema = EVENTS_SCHEMA) -> pa.Table:
        table = read_arrow(events, schema)
        descriptor = flight.FlightDescriptor.for_command(json.dumps(command).encode())

        def call(client: flight.FlightClient, options: flight.FlightCallOptions) -> pa.Table:
            writer, reader = client.do_exchange(descriptor, options)
            with writer:
                writer.begin(table.schema)
                writer.write_table(table)
                writer.done_writing()
                return reader.read_all()

        return self._call(call)

    def _action(self, kind: str, body: dict | None = None) -> Any:
        action = flight.Action(kind, json.dumps(body or {}).encode())

        def call(client: flight.FlightClient, options: flight.FlightCallOptions) -> Any:
            return json.loads(next(iter(client.do_action(action, options))).body.to_pybytes())

        return self._call(call)

    def lookup(self, events: ArrowSource) -> pa.Table:
        return self._exchange({"op": "lookup"}, events)

    def commit(self, events: ArrowSource, token: str) -> pa.Table:
        if not token:
            raise ValueError("commit needs a non-empty token")
        return self._exchange({"op": "commit", "token": token}, events)

    def delete(self, events: ArrowSource) -> int:
        return self._exchange({"op": "delete"}, events).column("deleted")[0].as_py()

    def clear_tokens(self, token: str) -> int:
        return self._action("clear_tokens", {"token": token})

    def scan(self) -> pa.RecordBatchReader:
        # Read whole so that a retry never resumes a half-read stream.
        table = self._call(lambda client, options: client.do_get(flight.Ticket(b"scan"), options).read_all())
        return table.to_reader()

    def stats(self) -> dict:
        return self._action("stats")

    def counters(self) -> dict:
        return self._action("counters")

    def reshard(self, shards: int, effective_at_us: int | None = None) -> list[dict]:
        return self._action("reshard", {"shards": shards, "effective_at_us": effective_at_us})

    def collect_garbage(self) -> dict:
        return self._action("gc")

    def heartbeat(self, dc: str | None, ttl_seconds: float) -> dict[str, float | None]:
        return self._action("heartbeat", {"dc": dc, "ttl_seconds": ttl_seconds})

    def claim_work(self, dc: str, stream: str, units: list[dict]) -> int:
        return self._action("claim_work", {"dc": dc, "stream": stream, "units": units})

    def finish_work(self, unit: str, pending: bool) -> int:
        return self._action("finish_work", {"unit": unit, "pending": pending})

    def work_claims(self, stream: str, files: list[str]) -> list[dict]:
        return self._action("work_claims", {"stream": stream, "files": files})

    def grant_clicks(self, wanted: ArrowSource, token: str, cap: int) -> pa.Table:
        return self._exchange({"op": "grant_clicks", "token": token, "cap": cap}, wanted, WANTED_SCHEMA)

    def remember_queries(self, dc: str, unit: str, attempt: int, part: int, queries: ArrowSource,
                         ingested_before_ts: int | None, latest_valid_ts: int, retention_seconds: float,
                         budget_bytes: int) -> dict:
        command = {"op": "remember_queries", "dc": dc, "unit": unit, "attempt": attempt, "part": part,
                   "ingested_before_ts": ingested_before_ts, "latest_valid_ts": latest_valid_ts,
                   "retention_seconds": retention_seconds, "budget_bytes": budget_bytes}
        return self._exchange(command, queries, PIECE_SCHEMA).to_pylist()[0]

    def remember_tailed(self, dc: str, queries: ArrowSource, tail: dict) -> dict:
        return self._exchange({"op": "remember_tailed", "dc": dc, "tail": tail}, queries, PIECE_SCHEMA).to_pylist()[0]

    def tail_state(self, dc: str) -> dict | None:
        return self._action("tail_state", {"dc": dc})

    def recall_queries(self, dc: str, wanted: ArrowSource) -> pa.Table:
        return self._exchange({"op": "recall_queries", "dc": dc}, wanted, WANTED_QUERIES)

    def queries_horizon(self, dc: str) -> int | None:
        return self._action("queries_horizon", {"dc": dc})

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
