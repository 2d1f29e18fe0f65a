"""The per-query click cap (Facebook §6.6: a skewed key must not take the join over), kept by the
registry so that it holds across work units, retries and datacenters at once.

One table in `<registry dir>/caps.duckdb`, written only through the registry: `grants`, per query and
registry token (a work unit), how many of the query's clicks that unit may join. A unit asks for what
it wants (its clicks of the query that found it); it gets what the other units' grants leave under the
cap. A retried unit gets its first attempt's grants back, so every attempt caps the same clicks. A
grant whose click the registry then refuses (another datacenter joined it) is not given back: the
query ends below its cap rather than over it.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import duckdb
import pyarrow as pa

GRANTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS grants (
    query_id   VARCHAR NOT NULL,
    token      VARCHAR NOT NULL,
    granted    BIGINT NOT NULL,
    granted_us BIGINT NOT NULL,
    PRIMARY KEY (query_id, token)
);
"""
WANTED_SCHEMA = pa.schema([pa.field("query_id", pa.string()), pa.field("wanted", pa.int64())])
GRANT_ANSWER = pa.schema([pa.field("query_id", pa.string()), pa.field("granted", pa.int64())])


class ClickCaps:
    """Grants on a DuckDB connection: this process's registry's own file (`open`), where every call is
    one transaction of its own, or the replicated registry's one file, whose log entries grant inside
    the entry's transaction (`in_transaction`) with the time stamped in the entry."""

    def __init__(self, con: duckdb.DuckDBPyConnection, in_transaction: bool = False):
        self._con = con
        self._con.execute(GRANTS_SCHEMA)
        self._lock = threading.Lock()
        self._in_transaction = in_transaction

    @classmethod
    def open(cls, path: Path) -> "ClickCaps":
        return cls(duckdb.connect(str(path)))

    def grant(self, wanted: pa.Table, token: str, cap: int, now_us: int | None = None) -> pa.Table:
        """`wanted`: query_id, wanted (clicks of the query this unit would join). Answer: query_id,
        granted, per input query."""
        if not token:
            raise ValueError("a grant needs a non-empty token")
        if cap < 1:
            raise ValueError(f"the click cap must be at least 1, got {cap}")
        request = wanted.select(WANTED_SCHEMA.names).cast(WANTED_SCHEMA)
        with self._lock:
            con = self._con
            con.register("wanted", request)
            try:
                if not self._in_transaction:
                    con.execute("BEGIN TRANSACTION")
                con.execute(
                    """
                    INSERT INTO grants
                    SELECT w.query_id, $token, GREATEST(0, LEAST(w.wanted, $cap - COALESCE(t.taken, 0))), $now
                    FROM wanted w
                    LEFT JOIN (SELECT query_id, SUM(granted) AS taken FROM grants
                               WHERE token <> $token AND query_id IN (SELECT query_id FROM wanted)
                               GROUP BY query_id) t USING (query_id)
                    WHERE NOT EXISTS (SELECT 1 FROM grants g WHERE g.query_id = w.query_id AND g.token = $token)
                    """,
                    {"token": token, "cap": cap, "now": time.time_ns() // 1000 if now_us is None else now_us},
                )
                answer = con.execute(
                    "SELECT w.query_id, g.granted FROM wanted w JOIN grants g "
                    "ON g.query_id = w.query_id AND g.token = $token",
                    {"token": token},
                ).to_arrow_table()
                if not self._in_transaction:
                    con.execute("COMMIT")
            except Exception:
                if not self._in_transaction:
                    con.execute("ROLLBACK")
                raise
            finally:
                con.unregister("wanted")
        return answer.cast(GRANT_ANSWER)

    def close(self) -> None:
        with self._lock:
            self._con.close()
