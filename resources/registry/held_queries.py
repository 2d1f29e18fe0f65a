"""The EventStore's memory tier held by the registry's own process (resources/event_store/memory_tier.py):
the five calls of the IdRegistry that reach it, for the engines whose process holds it (the registry
of one machine, a replica of the replicated registry), over their `_recent` (a RecentQueries)."""

from __future__ import annotations

import pyarrow as pa

from resources.event_store.memory_tier import PIECE_SCHEMA, Holding, RecentQueries
from resources.event_store.memory_tier import WANTED_SCHEMA as WANTED_QUERIES
from resources.registry.api import ArrowSource, read_arrow


class QueriesHeldHere:
    _recent: RecentQueries

    def remember_queries(self, dc: str, unit: str, attempt: int, part: int, queries: ArrowSource,
                         ingested_before_ts: int | None, holding: Holding) -> dict:
        return self._recent.put(dc, unit, attempt, part, read_arrow(queries, PIECE_SCHEMA), ingested_before_ts, holding)

    def remember_tailed(self, dc: str, queries: ArrowSource, tail: dict) -> dict:
        return self._recent.put_tailed(dc, read_arrow(queries, PIECE_SCHEMA), tail, Holding.of(tail))

    def tail_state(self, dc: str, offsets: bool = True) -> dict | None:
        return self._recent.tail_state(dc, offsets)

    def recall_queries(self, dc: str, wanted: ArrowSource) -> pa.Table:
        return self._recent.get(dc, read_arrow(wanted, WANTED_QUERIES))

    def queries_horizon(self, dc: str) -> int | None:
        return self._recent.horizon(dc)
