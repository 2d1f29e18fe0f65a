"""IdRegistry (Photon §2): the set of click ids already joined, with conditional commit and tokens.

A commit registers each id if and only if it is absent, storing the committer's token as its value.
Committing an id that is already there with the *same* token succeeds again: that is a retry of the
same work unit that lost its answer or crashed before writing output (Photon §3.3.2). Any other
token is refused. Once a work unit's output is durable its tokens are cleared; ids then stay
registered with a NULL token, and only ids whose output is unconfirmed keep a token.

Batches travel as Arrow data (tables, record batch readers or datasets such as the Parquet a Spark
job staged), so ids are scanned by DuckDB directly and never become Python objects.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Union

import dagster as dg
import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
from pydantic import PrivateAttr

ArrowSource = Union[pa.Table, pa.RecordBatchReader, ds.Dataset]

SCHEMA = """
CREATE TABLE IF NOT EXISTS registered_ids (
    click_id     VARCHAR PRIMARY KEY,
    timestamp_us BIGINT NOT NULL,
    token        VARCHAR,
    committed_at TIMESTAMP NOT NULL DEFAULT now()
)
"""


class IdRegistry(ABC):
    """What the pipeline needs from a registry, whatever process holds the ids."""

    @abstractmethod
    def lookup(self, ids: ArrowSource) -> pa.RecordBatchReader:
        """Of the `click_id`s given, those registered, with their token (NULL once cleared)."""

    @abstractmethod
    def commit(self, events: ArrowSource, token: str) -> pa.RecordBatchReader:
        """Conditionally register `(click_id, timestamp_us)` rows for `token`, as one transaction.

        Returns the `click_id`s now held by `token`: newly registered ones and ones this token had
        registered before. Every other id was refused (held by another token, or cleared)."""

    @abstractmethod
    def clear_tokens(self, token: str) -> int:
        """Forget `token` on its ids (their output is durable); returns how many ids it held."""

    @abstractmethod
    def scan(self) -> pa.RecordBatchReader:
        """Every registered id with its timestamp and token, for verification."""

    @abstractmethod
    def stats(self) -> dict[str, int]:
        """Counters: ids registered, ids holding a token, commit transactions, ids committed."""

    def close(self) -> None:
        """Release the registry's resources."""


class EmbeddedIdRegistry(IdRegistry):
    """The registry in an embedded DuckDB file. DuckDB admits one process per file, so this mode is
    for a single process (the `photon run` runner, tests); a service mode arrives with issue 3."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._con = duckdb.connect(str(path))
        self._con.execute(SCHEMA)
        # Transactions that insert overlapping keys conflict at COMMIT even inside one process, so
        # commits are serialised; each call gets its own cursor so results can be read afterwards.
        self._write_lock = threading.Lock()
        self._transactions = 0
        self._ids_committed = 0

    def for_executors(self):
        return None

    def lookup(self, ids: ArrowSource) -> pa.Table:
        cur = self._con.cursor()
        cur.register("lookup_ids", ids)
        return cur.sql(
            "SELECT r.click_id, r.token, 'registered' AS status FROM registered_ids r "
            "SEMI JOIN lookup_ids l ON r.click_id = l.click_id"
        ).to_arrow_table()

    def commit(self, events: ArrowSource, token: str) -> pa.RecordBatchReader:
        cur = self._con.cursor()
        cur.register("commit_events", events)
        with self._write_lock:
            cur.execute("BEGIN TRANSACTION")
            try:
                # Duplicates inside one batch keep their earliest timestamp.
                cur.execute(
                    "CREATE OR REPLACE TEMP TABLE batch AS "
                    "SELECT click_id, min(timestamp_us) AS timestamp_us FROM commit_events GROUP BY click_id"
                )
                cur.execute(
                    "INSERT INTO registered_ids (click_id, timestamp_us, token) "
                    "SELECT click_id, timestamp_us, ? FROM batch ON CONFLICT DO NOTHING",
                    [token],
                )
                cur.execute(
                    "CREATE OR REPLACE TEMP TABLE winners AS "
                    "SELECT b.click_id FROM batch b JOIN registered_ids r USING (click_id) WHERE r.token = ?",
                    [token],
                )
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            self._transactions += 1
        n = cur.sql("SELECT count(*) FROM batch").fetchall()[0][0]
        self._ids_committed += n
        return cur.sql(
            "SELECT b.click_id, CASE WHEN w.click_id IS NULL THEN 'refused' ELSE 'held' END AS status "
            "FROM batch b LEFT JOIN winners w USING (click_id)"
        ).to_arrow_table()

    def clear_tokens(self, token: str) -> int:
        with self._write_lock:
            return self._con.cursor().execute(
                "UPDATE registered_ids SET token = NULL WHERE token = ?", [token]
            ).fetchall()[0][0]

    def scan(self) -> pa.RecordBatchReader:
        return self._con.cursor().sql(
            "SELECT click_id, timestamp_us, token FROM registered_ids"
        ).to_arrow_reader()

    def stats(self) -> dict[str, int]:
        ids, tokened = self._con.cursor().sql("SELECT count(*), count(token) FROM registered_ids").fetchall()[0]
        return {
            "ids_registered": ids,
            "ids_with_token": tokened,
            "commit_transactions": self._transactions,
            "ids_committed": self._ids_committed,
        }

    def close(self) -> None:
        self._con.close()


_embedded: dict[Path, EmbeddedIdRegistry] = {}
_embedded_lock = threading.Lock()


def embedded_registry(path: Path) -> EmbeddedIdRegistry:
    """One connection per file per process, shared by every run the process executes."""
    path = path.resolve()
    with _embedded_lock:
        if path not in _embedded:
            _embedded[path] = EmbeddedIdRegistry(path)
        return _embedded[path]


def close_embedded_registries() -> None:
    with _embedded_lock:
        for registry in _embedded.values():
            registry.close()
        _embedded.clear()


class IdRegistryResource(dg.ConfigurableResource):
    """Chooses the registry implementation. `embedded`: DuckDB file under the data directory."""

    data_dir: str
    mode: str = "embedded"

    _registry: IdRegistry | None = PrivateAttr(default=None)

    def get(self) -> IdRegistry:
        if self._registry is None:
            if self.mode != "embedded":
                raise dg.Failure(f"unknown registry mode {self.mode!r} (supported: embedded)")
            from photon.layout import DataLayout

            self._registry = embedded_registry(DataLayout(Path(self.data_dir)).registry_file)
        return self._registry
