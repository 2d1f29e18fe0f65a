"""IdRegistry (Photon §2): the set of click ids already joined, with conditional commit and tokens.

A commit registers each id if and only if it is absent, storing the committer's token as its value.
Committing an id that is already there with the *same* token succeeds again: that is a retry of the
same work unit that lost its answer or crashed before writing output (Photon §3.3.2). Any other
token is refused. Once a work unit's output is durable its tokens are cleared; ids then stay
registered with a NULL token, and only ids whose output is unconfirmed keep a token. Ids older than
their shard's garbage-collection boundary are answered 'too_old' (§2.3).

Batches travel as Arrow data (tables, record batch readers or datasets such as the Parquet a Spark
job staged), so ids are handled by DuckDB and Arrow compute and never become Python objects.

Two implementations: `registry_shards.ShardedIdRegistry` in this process (mode "embedded"), and
`registry_service.RemoteIdRegistry`, a client of a registry server (mode "service").
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Union

import dagster as dg
import pyarrow as pa
import pyarrow.dataset as ds
from pydantic import PrivateAttr

if TYPE_CHECKING:
    from resources.registry_shards import ShardedIdRegistry

ArrowSource = Union[pa.Table, pa.RecordBatchReader, ds.Dataset]


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
        """JSON-serialisable counters: 'total', per shard 'shards', 'configuration', GC boundaries."""

    @abstractmethod
    def reshard(self, shards: int, effective_at_us: int | None = None) -> list[dict]:
        """Use `shards` shards for ids from `effective_at_us` on; returns the shard configuration."""

    @abstractmethod
    def collect_garbage(self) -> dict:
        """Run one garbage-collection pass now; returns the boundaries and the ids deleted."""

    def for_executors(self) -> "IdRegistry | None":
        """A picklable client Spark tasks can call directly, or None if the registry lives in this
        process only (then ids travel through the driver)."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Release the registry's resources."""


_embedded: dict[Path, "ShardedIdRegistry"] = {}
_embedded_lock = threading.Lock()


def embedded_registry(directory: Path) -> "ShardedIdRegistry":
    """One registry per directory per process: DuckDB lets one process hold a file, and every run
    the process executes shares it."""
    from resources.registry_shards import ShardedIdRegistry

    directory = Path(directory).resolve()
    with _embedded_lock:
        if directory not in _embedded:
            _embedded[directory] = ShardedIdRegistry(directory)
        return _embedded[directory]


def close_embedded_registries() -> None:
    with _embedded_lock:
        for registry in _embedded.values():
            registry.close()
        _embedded.clear()


class IdRegistryResource(dg.ConfigurableResource):
    """Chooses the registry implementation.

    - `embedded`: the sharded registry in this process, under `<data_dir>/registry/`.
    - `service`: a client of the registry server at `address` ("host:port"), started with
      `photon registry serve`. If the server has a shared secret, set `secret` from the environment
      so it stays out of run configuration: `secret=dg.EnvVar("PHOTON_REGISTRY_SECRET")`.
    """

    data_dir: str
    mode: str = "embedded"
    address: str | None = None
    secret: str | None = None

    _registry: IdRegistry | None = PrivateAttr(default=None)

    def get(self) -> IdRegistry:
        if self._registry is None:
            if self.mode == "embedded":
                from photon.layout import DataLayout

                self._registry = embedded_registry(DataLayout(Path(self.data_dir)).registry_dir)
            elif self.mode == "service":
                if not self.address:
                    raise dg.Failure("registry mode 'service' needs an address (host:port)")
                from resources.registry_service import RemoteIdRegistry

                self._registry = RemoteIdRegistry(self.address, self.secret)
            else:
                raise dg.Failure(f"unknown registry mode {self.mode!r} (supported: embedded, service)")
        return self._registry


ADDRESS_ENV = "PHOTON_REGISTRY_ADDRESS"
MODE_ENV = "PHOTON_REGISTRY_MODE"
SECRET_ENV = "PHOTON_REGISTRY_SECRET"


def registry_resource_from_env(data_dir: str) -> IdRegistryResource:
    """The registry this deployment uses: the service at PHOTON_REGISTRY_ADDRESS if set (`photon
    run` sets it to the local service it starts), else the embedded one; PHOTON_REGISTRY_MODE
    overrides the choice."""
    address = os.environ.get(ADDRESS_ENV)
    return IdRegistryResource(
        data_dir=data_dir,
        mode=os.environ.get(MODE_ENV) or ("service" if address else "embedded"),
        address=address,
        secret=dg.EnvVar(SECRET_ENV) if os.environ.get(SECRET_ENV) else None,
    )
