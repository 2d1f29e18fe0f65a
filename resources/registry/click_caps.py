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
    """Grants in one DuckDB file; every call is one short transaction."""

    def __init__(self, path: Path):
        self._con = duckdb.connect(str(path))
        self._con.execute(GRANTS_SCHEMA)
        self._lock = threading.Lock()

    def grant(self, wanted: pa.Table, token: str, cap: int) -> pa.Table:
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
                    {"token": token, "cap": cap, "now": time.time_ns() // 1000},
                )
                answer = con.execute(
                    "SELECT w.query_id, g.granted FROM wanted w JOIN grants g "
                    "ON g.query_id = w.query_id AND g.token = $token",
                    {"token": token},
                ).to_arrow_table()
                con.execute("COMMIT")
            except Exception:
                con.execute("ROLLBACK")
                raise
            finally:
                con.unregister("wanted")
        return answer.cast(GRANT_ANSWER)

    def close(self) -> None:
        with self._lock:
            self._con.close()
