"""The Dagster resource that gives runs their IdRegistry (Photon §2), and the embedded registries of
this process. The interface, `IdRegistry`, is in resources/registry/api.py (re-exported here).

Two implementations: `ShardedIdRegistry` (resources/registry/shards.py) in this process (mode
"embedded"), and `RemoteIdRegistry` (resources/registry/client.py), a client of a registry server
(mode "service").
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg
from pydantic import PrivateAttr

from resources.registry.api import ADDRESS_ENV, SECRET_ENV, ArrowSource, IdRegistry  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from resources.registry.shards import ShardedIdRegistry

_embedded: dict[Path, "ShardedIdRegistry"] = {}
_embedded_lock = threading.Lock()


def embedded_registry(directory: Path) -> "ShardedIdRegistry":
    """One registry per directory per process: DuckDB lets one process hold a file, and every run
    the process executes shares it."""
    from resources.registry.shards import ShardedIdRegistry

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
                from resources.state.layout import DataLayout

                self._registry = embedded_registry(DataLayout(Path(self.data_dir)).registry_dir)
            elif self.mode == "service":
                if not self.address:
                    raise dg.Failure("registry mode 'service' needs an address (host:port)")
                from resources.registry.client import RemoteIdRegistry

                self._registry = RemoteIdRegistry(self.address, self.secret)
            else:
                raise dg.Failure(f"unknown registry mode {self.mode!r} (supported: embedded, service)")
        return self._registry


MODE_ENV = "PHOTON_REGISTRY_MODE"


def registry_mode_from_env() -> str:
    """`service` when PHOTON_REGISTRY_ADDRESS is set, else `embedded`; PHOTON_REGISTRY_MODE overrides."""
    return os.environ.get(MODE_ENV) or ("service" if os.environ.get(ADDRESS_ENV) else "embedded")


def registry_resource_from_env(data_dir: str, resolved: bool = False) -> IdRegistryResource:
    """The registry this deployment uses: the service at PHOTON_REGISTRY_ADDRESS if set (`photon
    run` sets it to the local service it starts), else the embedded one; PHOTON_REGISTRY_MODE
    overrides the choice. The secret stays an `EnvVar` (out of the run configuration the UI shows)
    unless `resolved`: Dagster resolves it only where it builds the resource for a run, so a caller
    that uses the resource itself (the sensors, `photon run`'s leases) needs its value."""
    secret = os.environ.get(SECRET_ENV) or None
    return IdRegistryResource(
        data_dir=data_dir,
        mode=registry_mode_from_env(),
        address=os.environ.get(ADDRESS_ENV),
        secret=dg.EnvVar(SECRET_ENV) if secret and not resolved else secret,
    )
