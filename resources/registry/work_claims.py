"""Work ownership between datacenters, kept by the registry (Photon §2: the registry is the one
arbiter every datacenter's pipeline reaches; Ubiq §3: a work unit is processed where it is owned,
elsewhere only when its owner has failed).

Two tables in `<registry dir>/work.duckdb`, both written only through the registry:

- `leases`: per datacenter, when its lease expires (registry clock), and whether it was released. A
  datacenter's `photon run` or `photon up` renews it every few seconds while it is alive and
  releases it when it stops; a lease that expired without release is a datacenter that died.
- `claims`: the byte ranges of each click work unit a datacenter's dispatcher cut (`claimed`), and
  whether its run finished (`done`, or `done_pending` when it left clicks pending). Replicas have
  the same file names and bytes (docs/CONTRACTS.md), so a range names the same clicks in every
  datacenter: another datacenter skips a `done` range without reading it, and waits for a
  `claimed` one while its owner's lease lives.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from resources.runtime.repeating import repeated

if TYPE_CHECKING:
    from resources.registry.api import IdRegistry

CLAIMED, DONE, DONE_PENDING = "claimed", "done", "done_pending"

# How long a stop waits for the leases' release (and a renewal under way) before leaving them to lapse.
RELEASE_SECONDS = 10.0

WORK_SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (dc VARCHAR PRIMARY KEY, expires_us BIGINT NOT NULL, released BOOLEAN NOT NULL);
CREATE TABLE IF NOT EXISTS claims (
    unit         VARCHAR NOT NULL,
    dc           VARCHAR NOT NULL,
    stream       VARCHAR NOT NULL,
    file         VARCHAR NOT NULL,
    start_offset BIGINT NOT NULL,
    end_offset   BIGINT NOT NULL,
    state        VARCHAR NOT NULL,
    claimed_us   BIGINT NOT NULL,
    finished_us  BIGINT,
    PRIMARY KEY (unit, file, start_offset)
);
"""


def _now_us() -> int:
    return time.time_ns() // 1000


class WorkClaims:
    """Leases and claims on a DuckDB connection: this process's registry's own file (`open`), where every
    call is one short transaction, or the replicated registry's one file (resources/registry/replica_state.py),
    whose log entries call them inside the entry's transaction with the time stamped in the entry."""

    def __init__(self, con: duckdb.DuckDBPyConnection):
        self._con = con
        self._con.execute(WORK_SCHEMA)
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: Path) -> "WorkClaims":
        return cls(duckdb.connect(str(path)))

    def heartbeat(self, dc: str | None, ttl_seconds: float, now_us: int | None = None) -> dict[str, float | None]:
        """Renews `dc`'s lease for `ttl_seconds` (0 releases it; dc None only reads); returns every
        datacenter's lease as seconds left at `now_us` (default: the registry's clock; negative:
        expired, the datacenter died; None: released, it stopped)."""
        now = _now_us() if now_us is None else now_us
        with self._lock:
            if dc:
                self._con.execute(
                    "INSERT OR REPLACE INTO leases VALUES ($dc, $expires, $released)",
                    {"dc": dc, "expires": now + int(ttl_seconds * 1e6), "released": ttl_seconds <= 0},
                )
            rows = self._con.sql("SELECT dc, expires_us, released FROM leases").fetchall()
        return {name: None if released else round((expires - now) / 1e6, 3) for name, expires, released in rows}

    def claim(self, dc: str, stream: str, units: list[dict], now_us: int | None = None) -> int:
        """Records that `dc` cut these work units ({"unit", "ranges": [[file, start, end], ...]});
        a unit claimed again (a tick re-requesting it after a crash) keeps its state."""
        now = _now_us() if now_us is None else now_us
        rows = [(u["unit"], dc, stream, f, s, e, CLAIMED, now) for u in units for f, s, e in u["ranges"]]
        if not rows:
            return 0
        with self._lock:
            self._con.executemany(
                "INSERT INTO claims VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL) ON CONFLICT DO NOTHING", rows)
        return len(rows)

    def finish(self, unit: str, pending: bool, now_us: int | None = None) -> int:
        """The unit's run wrote all its output (`pending`: some of its clicks wait for their query in
        the pending clicks of its datacenter); returns how many ranges it claimed."""
        with self._lock:
            return len(self._con.execute(
                "UPDATE claims SET state = $state, finished_us = $now WHERE unit = $unit RETURNING 1",
                {"state": DONE_PENDING if pending else DONE, "now": _now_us() if now_us is None else now_us,
                 "unit": unit},
            ).fetchall())

    def claims(self, stream: str, files: list[str], reader: duckdb.DuckDBPyConnection | None = None) -> list[dict]:
        """Every datacenter's claims on these files of `stream`, oldest first (through `reader`, a
        cursor of a replica's reading thread, if given)."""
        if not files:
            return []
        with self._lock:
            rows = (reader or self._con).execute(
                "SELECT unit, dc, file, start_offset, end_offset, state, claimed_us, finished_us FROM claims "
                "WHERE stream = $stream AND list_contains($files, file) ORDER BY claimed_us, file, start_offset",
                {"stream": stream, "files": files},
            ).fetchall()
        keys = ("unit", "dc", "file", "start", "end", "state", "claimed_us", "finished_us")
        return [dict(zip(keys, row)) for row in rows]

    def close(self) -> None:
        with self._lock:
            self._con.close()


@contextlib.contextmanager
def leases_held(registry: "IdRegistry", datacenters: list[str], lease_seconds: float, log: logging.Logger):
    """Holds these datacenters' leases while the block runs: renewed every quarter lease on a thread,
    released at the end so that the others take over at once. A failed renewal is logged and retried
    (the registry may be restarting); the lease then lapses only if it stays down."""
    def renew() -> None:
        for dc in datacenters:
            try:
                registry.heartbeat(dc, lease_seconds)
            except Exception as error:  # noqa: BLE001 - any failure: try again next quarter
                log.warning("could not renew the lease of %s: %s", dc, str(error).splitlines()[0])

    def release() -> None:
        for dc in datacenters:
            with contextlib.suppress(Exception):
                registry.heartbeat(dc, 0)

    try:
        with repeated(renew, lease_seconds / 4, "lease-renewal", wait_seconds=RELEASE_SECONDS):
            yield
    finally:
        # Bounded: a registry without its etcd majority holds a change until it fails, and a stop must
        # not wait on it; an unreleased lease lapses by itself.
        releasing = threading.Thread(target=release, name="lease-release", daemon=True)
        releasing.start()
        releasing.join(RELEASE_SECONDS)
        if releasing.is_alive():
            log.warning("the leases of %s not released within %.0f s (registry unreachable): they lapse within "
                        "%.0f s", ",".join(datacenters), RELEASE_SECONDS, lease_seconds)
