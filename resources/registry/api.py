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

from abc import ABC, abstractmethod
from typing import Union

import pyarrow as pa
import pyarrow.dataset as ds

from resources.event_store.memory_tier import Holding

ArrowSource = Union[pa.Table, pa.RecordBatchReader, ds.Dataset]
# The registry service's shared secret, for its server and its clients (`photon registry` reads it
# here: the command does not load Dagster).
SECRET_ENV = "PHOTON_REGISTRY_SECRET"
# The registry service's address (`host:port`), for the processes that call it.
ADDRESS_ENV = "PHOTON_REGISTRY_ADDRESS"


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

    def for_executors(self) -> "IdRegistry | None":
        """A picklable client Spark tasks can call directly, or None if the registry lives in this
        process only (then ids travel through the driver)."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Release the registry's resources."""
