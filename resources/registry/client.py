"""The registry service's client (`RemoteIdRegistry`): the Arrow Flight calls of the protocol in
resources/registry/service.py, retried across transient failures and, for the replicated registry,
across its replicas; and the errors a caller sees."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.flight as flight

from resources.event_store.memory_tier import PIECE_SCHEMA, Holding, TierLost
from resources.event_store.memory_tier import WANTED_SCHEMA as WANTED_QUERIES
from resources.registry.api import ArrowSource, IdRegistry, RegistryUnavailable
from resources.registry.click_caps import WANTED_SCHEMA
from resources.registry.shards import EVENTS_SCHEMA, read_arrow

log = logging.getLogger(__name__)

__all__ = ["RemoteIdRegistry", "RegistryUnavailable", "RegistryAuthenticationError", "parse_address",
           "parse_addresses", "first_line", "fetch_snapshot"]

PROBE_SECONDS = 1.0  # a replica that does not answer its health probe within this is moved off
PREFERRED_EVERY_SECONDS = 5.0  # how often a client away from its preferred replica asks whether it is back


class RegistryAuthenticationError(PermissionError):
    """The registry server rejected the client's shared secret."""


def parse_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"registry address {address!r} is not HOST:PORT")
    return host, int(port)


def parse_addresses(text: str | list[str]) -> list[str]:
    """`HOST:PORT[,HOST:PORT...]` (a replicated registry's replicas, the preferred first)."""
    addresses = [a.strip() for a in (text.split(",") if isinstance(text, str) else text) if a.strip()]
    if not addresses:
        raise ValueError("no registry address given")
    for address in addresses:
        parse_address(address)
    return addresses


def first_line(error: BaseException) -> str:
    """The message of an error, without Flight's ". Detail: ..." suffix and later lines."""
    text = str(error).strip()
    return text.splitlines()[0].split(". Detail: ")[0] if text else type(error).__name__


TRANSIENT = (flight.FlightUnavailableError, flight.FlightTimedOutError, ConnectionError)


class RemoteIdRegistry(IdRegistry):
    """Client of a registry server, or of the replicas of the replicated registry (`address`: one
    HOST:PORT, or several, comma-separated, the preferred one first). Connects lazily and pickles as
    (addresses, secret, settings, last seen revision), so Spark executors can each build one cheaply.

    Transient failures (server unavailable, timed out, connection refused or reset) are retried with
    exponential backoff, up to `max_attempts` rounds, then raise `RegistryUnavailable`. With several
    replicas, a call goes to the preferred one while it answers; a refused connection, an unavailable
    replica (catching up, or without an etcd majority) or one that gives no answer to a health probe
    within PROBE_SECONDS after a call timed out moves the client to the next, and it goes back to the
    preferred once that one is ready again (a long commit may still take its full timeout). A change is
    sent with a request id kept across retries, so a replica applies it once however many times it is
    sent (and retrying a commit under the same token is safe anyway: its ids come back 'held'). Every
    answer names the log revision it reflects; a read asks for at least the last one seen."""

    def __init__(self, address: str | list[str], secret: str | None = None, timeout_seconds: float = 30,
                 max_attempts: int = 6, backoff_seconds: float = 0.1, max_backoff_seconds: float = 5.0):
        self.addresses = parse_addresses(address)
        self.address = ",".join(self.addresses)
        self.secret = secret
        self.timeout_seconds = timeout_seconds
        self.max_attempts = max(1, max_attempts)
        self.backoff_seconds = backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.seen_revision = 0
        self._init_connections()

    def _init_connections(self) -> None:
        self._clients: dict[str, flight.FlightClient] = {}
        self._lock = threading.Lock()
        self._current = 0
        self._away_checked = 0.0

    def for_executors(self) -> "RemoteIdRegistry":
        return self

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for name in ("_clients", "_lock", "_current", "_away_checked"):
            del state[name]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_connections()

    @property
    def current(self) -> str:
        return self.addresses[self._current]

    def _connection(self, address: str) -> flight.FlightClient:
        with self._lock:
            if address not in self._clients:
                self._clients[address] = flight.FlightClient(f"grpc://{address}")
            return self._clients[address]

    def _reset(self, address: str) -> None:
        with self._lock:
            client = self._clients.pop(address, None)
        if client is not None:
            client.close()

    def _options(self, timeout: float | None = None) -> flight.FlightCallOptions:
        headers = [(b"authorization", f"Bearer {self.secret}".encode())] if self.secret else []
        return flight.FlightCallOptions(timeout=timeout or self.timeout_seconds, headers=headers)

    def healthy(self, address: str) -> bool:
        """Whether the replica at `address` answers its health probe within PROBE_SECONDS, ready."""
        try:
            answer = self._connection(address).do_action(flight.Action("health", b"{}"), self._options(PROBE_SECONDS))
            return bool(json.loads(next(iter(answer)).body.to_pybytes())["value"].get("ready"))
        except (flight.FlightError, pa.ArrowException, ConnectionError, StopIteration, KeyError, ValueError):
            self._reset(address)
            return False

    def _back_to_preferred(self) -> None:
        """Away from the preferred replica, every PREFERRED_EVERY_SECONDS: back to it once it is ready
        (each datacenter's memory tier lives in its preferred replica)."""
        if self._current and time.monotonic() - self._away_checked > PREFERRED_EVERY_SECONDS:
            self._away_checked = time.monotonic()
            if self.healthy(self.addresses[0]):
                log.info("registry replica %s is back; using it again", self.addresses[0])
                self._current = 0

    def _move_on(self, address: str, error: BaseException) -> bool:
        """After a transient failure at `address`: moves to the next replica if it is unavailable or
        does not answer a health probe; True if the client moved."""
        if len(self.addresses) == 1 or self.current != address:
            return False
        if isinstance(error, flight.FlightTimedOutError) and self.healthy(address):
            return False
        self._current = (self._current + 1) % len(self.addresses)
        self._away_checked = time.monotonic()
        log.warning("registry replica %s: %s; moving to %s", address, first_line(error), self.current)
        return True

    def _call(self, call: Callable[[flight.FlightClient, flight.FlightCallOptions], Any]) -> Any:
        delay = self.backoff_seconds
        rounds = self.max_attempts * len(self.addresses)
        for attempt in range(1, rounds + 1):
            self._back_to_preferred()
            address = self.current
            try:
                return call(self._connection(address), self._options())
            except flight.FlightUnauthenticatedError as error:
                raise RegistryAuthenticationError(
                    f"registry at {address} rejected the credentials: {first_line(error)}") from None
            except flight.FlightServerError as error:
                if "memory tier lost" in str(error):
                    raise TierLost(first_line(error)) from None
                raise
            except TRANSIENT as error:
                self._reset(address)
                if attempt == rounds:
                    raise RegistryUnavailable(f"registry at {self.address} unreachable after "
                                              f"{attempt} attempts: {first_line(error)}") from None
                if self._move_on(address, error) and self._current != 0:
                    continue  # another replica, at once; a full round of them backs off below
                log.warning("registry at %s: attempt %d failed (%s); retrying", address, attempt, first_line(error))
                time.sleep(min(delay, self.max_backoff_seconds))
                delay *= 2
            except pa.ArrowInvalid as error:
                raise ValueError(first_line(error)) from None
        raise AssertionError("unreachable")

    def _saw(self, revision: Any) -> None:
        if revision is not None:
            self.seen_revision = max(self.seen_revision, int(revision))

    def _exchange(self, command: dict, events: ArrowSource, schema: pa.Schema = EVENTS_SCHEMA,
                  change: bool = False) -> pa.Table:
        table = read_arrow(events, schema)
        command = {**command, "min_revision": self.seen_revision, **({"request_id": uuid.uuid4().hex} if change else {})}
        descriptor = flight.FlightDescriptor.for_command(json.dumps(command).encode())

        def call(client: flight.FlightClient, options: flight.FlightCallOptions) -> pa.Table:
            writer, reader = client.do_exchange(descriptor, options)
            with writer:
                writer.begin(table.schema)
                writer.write_table(table)
                writer.done_writing()
                return reader.read_all()

        answer = self._call(call)
        self._saw(json.loads((answer.schema.metadata or {}).get(b"revision", b"null")))
        return answer

    def _action(self, kind: str, body: dict | None = None, change: bool = False) -> Any:
        body = {**(body or {}), "min_revision": self.seen_revision, **({"request_id": uuid.uuid4().hex} if change else {})}
        action = flight.Action(kind, json.dumps(body).encode())

        def call(client: flight.FlightClient, options: flight.FlightCallOptions) -> Any:
            return json.loads(next(iter(client.do_action(action, options))).body.to_pybytes())

        answer = self._call(call)
        self._saw(answer.get("revision"))
        return answer["value"]

    def lookup(self, events: ArrowSource) -> pa.Table:
        return self._exchange({"op": "lookup"}, events).replace_schema_metadata(None)

    def commit(self, events: ArrowSource, token: str) -> pa.Table:
        if not token:
            raise ValueError("commit needs a non-empty token")
        return self._exchange({"op": "commit", "token": token}, events, change=True).replace_schema_metadata(None)

    def delete(self, events: ArrowSource) -> int:
        return self._exchange({"op": "delete"}, events, change=True).column("deleted")[0].as_py()

    def clear_tokens(self, token: str) -> int:
        return self._action("clear_tokens", {"token": token}, change=True)

    def scan(self) -> pa.RecordBatchReader:
        # Read whole so that a retry never resumes a half-read stream.
        table = self._call(lambda client, options: client.do_get(flight.Ticket(b"scan"), options).read_all())
        return table.to_reader()

    def stats(self) -> dict:
        return self._action("stats")

    def counters(self) -> dict:
        return self._action("counters")

    def reshard(self, shards: int, effective_at_us: int | None = None) -> list[dict]:
        return self._action("reshard", {"shards": shards, "effective_at_us": effective_at_us}, change=True)

    def collect_garbage(self) -> dict:
        return self._action("gc", change=True)

    def heartbeat(self, dc: str | None, ttl_seconds: float) -> dict[str, float | None]:
        return self._action("heartbeat", {"dc": dc, "ttl_seconds": ttl_seconds}, change=dc is not None)

    def claim_work(self, dc: str, stream: str, units: list[dict]) -> int:
        return self._action("claim_work", {"dc": dc, "stream": stream, "units": units}, change=True)

    def finish_work(self, unit: str, pending: bool) -> int:
        return self._action("finish_work", {"unit": unit, "pending": pending}, change=True)

    def work_claims(self, stream: str, files: list[str]) -> list[dict]:
        return self._action("work_claims", {"stream": stream, "files": files})

    def grant_clicks(self, wanted: ArrowSource, token: str, cap: int) -> pa.Table:
        return self._exchange({"op": "grant_clicks", "token": token, "cap": cap}, wanted, WANTED_SCHEMA,
                              change=True).replace_schema_metadata(None)

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
        return self._exchange({"op": "recall_queries", "dc": dc}, wanted, WANTED_QUERIES).replace_schema_metadata(None)

    def recall_with_tail(self, dc: str, wanted: ArrowSource) -> tuple[dict | None, pa.Table, int | None]:
        """The three reads of one lookup in one call: answered by one process (see IdRegistry)."""
        answer = self._exchange({"op": "recall_with_tail", "dc": dc}, wanted, WANTED_QUERIES)
        metadata = answer.schema.metadata or {}
        return (json.loads(metadata.get(b"tail", b"null")), answer.replace_schema_metadata(None),
                json.loads(metadata.get(b"horizon", b"null")))

    def replicas_agreement(self) -> dict:
        """Whether the replicas hold the same ids: each one's digest of its id set at the log's head as
        one quorum read finds it (resources/registry/replica_state.py: digest_at), compared; a replica
        that does not answer is counted apart. The registry of one machine is one replica."""
        self.heartbeat(None, 0)  # a read at the log's head: the answer names its revision
        digests = self.replica_digests(self.seen_revision)
        if all(d is None or d.get("replica") is None for d in digests.values()) and len(digests) == 1:
            return {"replicas": 1, "replicas_answering": 1, "distinct_id_sets": 1, "revision": None, "digests": {}}
        answering = {address: d for address, d in digests.items() if d is not None}
        return {"replicas": len(digests), "replicas_answering": len(answering),
                "distinct_id_sets": len({(d["ids"], d["digest"]) for d in answering.values()}),
                "revision": self.seen_revision,
                "digests": {d["replica"]: {"ids": d["ids"], "digest": d["digest"]} for d in answering.values()}}

    def replica_digests(self, revision: int) -> dict[str, dict | None]:
        """Each replica's digest of its id set at `revision` (None: it did not answer), asked directly."""
        action = flight.Action("digest", json.dumps({"revision": revision}).encode())
        digests = {}
        for address in self.addresses:
            try:
                answer = next(iter(self._connection(address).do_action(action, self._options())))
                digests[address] = json.loads(answer.body.to_pybytes())["value"]
            except (flight.FlightError, pa.ArrowException, ConnectionError, StopIteration):
                self._reset(address)
                digests[address] = None
        return digests

    def queries_horizon(self, dc: str) -> int | None:
        return self._action("queries_horizon", {"dc": dc})

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()


def fetch_snapshot(address: str, path: Path, secret: str | None = None, timeout_seconds: float = 600) -> int:
    """A copy of the state file of the replica at `address` (resources/registry/replica.py: snapshot),
    written to `path`; returns the revision it was taken at."""
    client = flight.FlightClient(f"grpc://{address}")
    headers = [(b"authorization", f"Bearer {secret}".encode())] if secret else []
    try:
        reader = client.do_get(flight.Ticket(b"snapshot"), flight.FlightCallOptions(timeout=timeout_seconds, headers=headers))
        revision = int(reader.schema.metadata[b"revision"])
        with open(path, "wb") as out:
            for chunk in reader:
                for block in chunk.data.column(0).to_pylist():
                    out.write(block)
        return revision
    finally:
        client.close()
