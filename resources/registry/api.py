"""IdRegistry (Photon §2): the set of click ids already joined, with conditional commit and tokens.

A commit registers each id if and only if it is absent, storing the committer's token as its value.
Committing an id that is already there with the *same* token succeeds again: that is a retry of the
same work unit that lost its answer or crashed before writing output (Photon §3.3.2). Any other
token is refused. Once a work unit's output is durable its tokens are cleared; ids then stay
registered with a NULL token, and only ids whose output is unconfirmed keep a token. Ids older than
their shard's garbage-collection boundary are answered 'too_old' (§2.3).

Batches travel as Arrow data (tables, record batch readers or datasets such as the Parquet a Spark
job staged), so ids are handled by DuckDB and Arrow compute and never become Python objects.

The same process keeps what the pipeline's runs share besides the ids: datacenters' leases and
work claims (resources/registry/work_claims.py), the per-query click cap (resources/registry/click_caps.py), and the
EventStore's memory tier (resources/event_store/memory_tier.py).

The implementations: `registry_shards.ShardedIdRegistry` in this process, and
`registry_service.RemoteIdRegistry`, a client of a registry server; `registry.IdRegistryResource`
chooses one.
"""

from __future__ import annotations

import contextvars
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Union

import pyarrow as pa
import pyarrow.dataset as ds

from resources.event_store.memory_tier import Holding

ArrowSource = Union[pa.Table, pa.RecordBatchReader, ds.Dataset]
# The registry service's shared secret, for its server and its clients (`photon registry` reads it
# here: the command does not load Dagster).
SECRET_ENV = "PHOTON_REGISTRY_SECRET"
# The registry service's address (`host:port`), for the processes that call it; for the replicated
# registry, its replicas' addresses, comma-separated, the preferred (this datacenter's) first.
ADDRESS_ENV = "PHOTON_REGISTRY_ADDRESS"


# In a data directory's `registry/`, the replicated registry's configuration (photon/registry_cluster.py):
# its presence says the ids live in the replicas (`registry/replica-<n>/`), never in this directory's own
# files, which nothing may then open as the registry of one machine.
REPLICATED_FILE = "replicated.json"


class RegistryIsReplicated(ValueError):
    """A data directory whose registry is replicated, opened as the registry of one machine."""


def refuse_if_replicated(directory) -> None:
    """RegistryIsReplicated (one line saying what to do) if `directory` (a data directory's
    `registry/`) holds the replicated registry's configuration."""
    from pathlib import Path

    marker = Path(directory) / REPLICATED_FILE
    if marker.exists():
        raise RegistryIsReplicated(
            f"the registry of {Path(directory).parent} is replicated ({marker}): reach its replicas with "
            f"{ADDRESS_ENV} (`photon registry serve --replicas N` prints them), or give photon run / photon up "
            "--registry-replicas N")


class RegistryUnavailable(ConnectionError):
    """The registry could not answer now (unreachable, or a replica without an etcd majority, or one
    still catching up): the call may be retried, safely (a commit under the same token and request
    id changes nothing twice)."""


@dataclass
class CallContext:
    """What a registry server knows of the call it serves beyond its arguments (resources/registry/
    service.py sets it): the client's request id, kept across its retries, which a replicated registry
    applies once (resources/registry/log_entries.py); the log revision the client last saw, which a
    replica serving a read must have applied (read your writes); and, set by a replicated engine, the
    revision its answer reflects, which the client then has seen."""

    request_id: str | None = None
    min_revision: int = 0
    revision: int | None = None


_call = contextvars.ContextVar("registry_call", default=None)


def call_context() -> CallContext:
    """The context of the call this thread serves (a blank one outside a server's call)."""
    return _call.get() or CallContext()


@contextmanager
def serving(context: CallContext) -> Iterator[CallContext]:
    token = _call.set(context)
    try:
        yield context
    finally:
        _call.reset(token)


def read_arrow(source: ArrowSource, schema: pa.Schema) -> pa.Table:
    """The columns of `schema` from any Arrow source, as a table of its types."""
    if isinstance(source, ds.Dataset):
        table = source.to_table(columns=list(schema.names))
    elif isinstance(source, pa.RecordBatchReader):
        table = source.read_all()
    else:
        table = source
    missing = set(schema.names) - set(table.column_names)
    if missing:
        raise ValueError(f"registry input lacks column(s) {sorted(missing)}: needs {', '.join(schema.names)}")
    return table.select(schema.names).cast(schema)



class IdRegistry(ABC):
    """What the pipeline needs from a registry, whatever process holds the ids.

    Inputs are Arrow sources with columns `click_id` (string) and `timestamp_us` (int64); the
    timestamp chooses the id's shard and decides whether it is older than the GC boundary."""

    @abstractmethod
    def lookup(self, events: ArrowSource) -> pa.Table:
        """One row (click_id, token, status) per distinct input id that is registered (status
        'registered'; token NULL once cleared) or older than its shard's GC boundary ('too_old',
        token NULL). Unregistered ids are absent."""

    @abstractmethod
    def commit(self, events: ArrowSource, token: str) -> pa.Table:
        """Conditionally register the ids for `token`; duplicates keep their earliest timestamp.

        One row (click_id, status) per distinct input id: 'held' (registered now, or earlier by this
        token), 'refused' (held by another token, or cleared) or 'too_old' (not registered)."""

    @abstractmethod
    def clear_tokens(self, token: str) -> int:
        """Forget `token` on its ids (their output is durable); returns how many ids it held."""

    @abstractmethod
    def delete(self, events: ArrowSource) -> int:
        """Recovery: unregister these ids; returns how many were registered."""

    @abstractmethod
    def scan(self) -> pa.RecordBatchReader:
        """Every registered id (click_id, timestamp_us, token), all shards, for verification."""

    @abstractmethod
    def stats(self) -> dict:
        """JSON-serialisable counters: 'total', per shard 'shards', 'configuration', GC boundaries,
        'recent_queries'; with the ids each shard holds, counted (a scan of every shard)."""

    @abstractmethod
    def counters(self) -> dict:
        """`stats` without the ids held: only counters kept in memory, for a run's metadata."""

    @abstractmethod
    def reshard(self, shards: int, effective_at_us: int | None = None) -> list[dict]:
        """Use `shards` shards for ids from `effective_at_us` on; returns the shard configuration."""

    @abstractmethod
    def collect_garbage(self) -> dict:
        """Run one garbage-collection pass now; returns the boundaries and the ids deleted."""

    # Work ownership between datacenters (resources/registry/work_claims.py has the semantics).
    @abstractmethod
    def heartbeat(self, dc: str | None, ttl_seconds: float) -> dict[str, float | None]:
        """Renew `dc`'s lease (0: release; None: only read); every datacenter's seconds left
        (negative: expired; None: released)."""

    @abstractmethod
    def claim_work(self, dc: str, stream: str, units: list[dict]) -> int:
        """Record the byte ranges of work units `dc` cut ({"unit", "ranges"})."""

    @abstractmethod
    def finish_work(self, unit: str, pending: bool) -> int:
        """Mark a work unit's ranges done (`pending`: it left pending clicks)."""

    @abstractmethod
    def work_claims(self, stream: str, files: list[str]) -> list[dict]:
        """Every datacenter's claims on these files."""

    @abstractmethod
    def grant_clicks(self, wanted: ArrowSource, token: str, cap: int) -> pa.Table:
        """The per-query click cap (resources/registry/click_caps.py has the semantics): `wanted` has
        query_id, wanted; the answer query_id, granted."""

    # The EventStore's memory tier, held by the same process (resources/event_store/memory_tier.py has the
    # semantics): one long-lived process that every run of either deployment can call.
    @abstractmethod
    def remember_queries(self, dc: str, unit: str, attempt: int, part: int, queries: ArrowSource,
                         ingested_before_ts: int | None, holding: Holding) -> dict:
        """Hold one task's share of a work unit's query lines (recent_queries.PIECE_SCHEMA)."""

    @abstractmethod
    def remember_tailed(self, dc: str, queries: ArrowSource, tail: dict) -> dict:
        """Hold the lines a query tailer read (PIECE_SCHEMA) with where it read to (`tail`: "part",
        "offsets" of the files this put read, "writers", and the put's "latest_valid_ts",
        "retention_seconds", "budget_bytes")."""

    @abstractmethod
    def tail_state(self, dc: str, offsets: bool = True) -> dict | None:
        """What `dc`'s query tailer recorded with its puts ("part", "writers", and with `offsets` where
        it read each file to); None while no tailer feeds it."""

    @abstractmethod
    def recall_queries(self, dc: str, wanted: ArrowSource) -> pa.Table:
        """The wanted query ids (column query_id) held, once each (PIECE_SCHEMA; `line` null for a
        query held located only)."""

    @abstractmethod
    def queries_horizon(self, dc: str) -> int | None:
        """The newest query-id time the memory tier may lack (None: unknown)."""

    def recall_with_tail(self, dc: str, wanted: ArrowSource) -> tuple[dict | None, pa.Table, int | None]:
        """One click lookup's three reads of the memory tier, answered by one process (its tier is
        that process's): the tailer's writers' times (`tail_state` without offsets) read first, then
        the wanted queries held (`recall_queries`), then the horizon (`queries_horizon`), read last so
        that an eviction meanwhile only raises it."""
        tail = self.tail_state(dc, offsets=False)
        lines = self.recall_queries(dc, wanted)
        return tail, lines, self.queries_horizon(dc)

    def for_executors(self) -> "IdRegistry | None":
        """A picklable client Spark tasks can call directly, or None if the registry lives in this
        process only (then ids travel through the driver)."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Release the registry's resources."""
