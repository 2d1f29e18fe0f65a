"""The registry service's client (`RemoteIdRegistry`): the Arrow Flight calls of the protocol in
resources/registry/service.py, retried across transient failures, and the errors a caller sees."""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict
from typing import Any, Callable

import pyarrow as pa
import pyarrow.flight as flight

from resources.event_store.memory_tier import PIECE_SCHEMA, Holding
from resources.event_store.memory_tier import WANTED_SCHEMA as WANTED_QUERIES
from resources.registry.api import ArrowSource, IdRegistry
from resources.registry.click_caps import WANTED_SCHEMA
from resources.registry.shards import EVENTS_SCHEMA, read_arrow

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
                         ingested_before_ts: int | None, holding: Holding) -> dict:
        command = {"op": "remember_queries", "dc": dc, "unit": unit, "attempt": attempt, "part": part,
                   "ingested_before_ts": ingested_before_ts, **asdict(holding)}
        return self._exchange(command, queries, PIECE_SCHEMA).to_pylist()[0]

    def remember_tailed(self, dc: str, queries: ArrowSource, tail: dict) -> dict:
        return self._exchange({"op": "remember_tailed", "dc": dc, "tail": tail}, queries, PIECE_SCHEMA).to_pylist()[0]

    def tail_state(self, dc: str, offsets: bool = True) -> dict | None:
        return self._action("tail_state", {"dc": dc, "offsets": offsets})

    def recall_queries(self, dc: str, wanted: ArrowSource) -> pa.Table:
        return self._exchange({"op": "recall_queries", "dc": dc}, wanted, WANTED_QUERIES)

    def queries_horizon(self, dc: str) -> int | None:
        return self._action("queries_horizon", {"dc": dc})

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
