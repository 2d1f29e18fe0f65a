"""What the dispatchers and runs know about each datacenter's query stream, read on every tick
without Spark (documents of resources/state/sidecars.py):

- Query progress: per query writer (`server_ip:process_id`, the prefix of its event ids), the newest
  `timestamp_us` ingested, and how many work units brought lines at or behind that progress
  (backfills). A writer logs in timestamp order, so once its progress passes a query's timestamp
  that query is either in what was read or in lines read later as a backfill (a file of the writer
  the dispatcher reached late), or lost.
- Query tail: the query tailer's mirror of what it fed the memory tier (QueryTail; its writers'
  times as a QueryProgress of its own, and a watermark `query_tail`). The tailer is its one writer.
- Query cache: bounds of what the datacenter's cache tier holds (see QueryCache).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from resources.state.sidecars import Document, locked, read_document, write_document


@dataclass
class WriterProgress:
    max_ts: int
    backfills: int = 0  # work units that brought lines at or behind max_ts


@dataclass
class QueryProgress:
    writers: dict[str, WriterProgress] = field(default_factory=dict)

    @property
    def max_ts(self) -> int | None:
        """The query stream's progress: its newest ingested event time."""
        return max((w.max_ts for w in self.writers.values()), default=None)

    @classmethod
    def load(cls, path: Path) -> "QueryProgress":
        doc = read_document(path)
        if doc is None:
            return cls()
        # Documents written before backfills were counted list the writer's files instead.
        return cls({name: WriterProgress(w["max_ts"], w.get("backfills", 0)) for name, w in doc["writers"].items()})

    def with_tailed(self, tailed: "QueryProgress") -> "QueryProgress":
        """The query stream's progress as far as it is known: each writer's newest time ingested by a
        query run or put into the memory tier by the query tailer, whichever is later. Backfills are
        the query runs' only: the tailer reads every file in log order, and a pending click's
        digest counts the runs' backfills."""
        writers = {name: WriterProgress(w.max_ts, w.backfills) for name, w in self.writers.items()}
        for name, w in tailed.writers.items():
            known = writers.setdefault(name, WriterProgress(w.max_ts))
            known.max_ts = max(known.max_ts, w.max_ts)
        return QueryProgress(writers)

    @classmethod
    def merge(cls, path: Path, ingested: dict[str, tuple[int, int]]) -> "QueryProgress":
        """Adds one work unit's writers: per writer, the oldest and newest timestamp of its lines.
        A work unit reaching back to the writer's progress counts as a backfill: a pending click
        may wait for it. A retried work unit that had already merged counts once more, which costs
        at most one extra pending-click retry."""
        with locked(path):
            progress = cls.load(path)
            for name, (min_ts, max_ts) in ingested.items():
                known = progress.writers.get(name)
                if known is None:
                    progress.writers[name] = WriterProgress(max_ts)
                    continue
                if min_ts <= known.max_ts:
                    known.backfills += 1
                known.max_ts = max(known.max_ts, max_ts)
            write_document(path, {"writers": {name: asdict(w) for name, w in progress.writers.items()}})
            return progress


# A query tail mirror older than this is a tailer that is not running: the dispatchers go by the
# query runs alone then.
TAIL_FRESH_SECONDS = 10.0


@dataclass
class QueryTail(Document):
    """The query tailer's mirror (photon/query_tail.py): where it read each query log to (the same
    offsets it recorded in the registry service with its last put) and when it last polled."""

    offsets: dict[str, int] = field(default_factory=dict)
    part: int = 0
    updated_at: float = 0.0

    def fresh(self, now: float | None = None) -> bool:
        """Whether a tailer is feeding the memory tier (it polled within TAIL_FRESH_SECONDS)."""
        return (time.time() if now is None else now) - self.updated_at <= TAIL_FRESH_SECONDS


def known_query_progress(progress_file: Path, tail_file: Path, tail_progress_file: Path) -> QueryProgress:
    """The query stream's progress as the scheduling of pending clicks goes by it: the query runs',
    with the query tailer's writers' times while its mirror is fresh (QueryProgress.with_tailed)."""
    progress = QueryProgress.load(progress_file)
    if QueryTail.load(tail_file).fresh():
        progress = progress.with_tailed(QueryProgress.load(tail_progress_file))
    return progress


@dataclass
class QueryCache:
    """What the cache tier (`query_logs`) of one datacenter holds, for the runs that evict and read it.

    - `oldest_ts`: a lower bound of its event times, so that table maintenance scans it for eviction only
      once the cache boundary passes it. None (unknown) until the first scan. A concurrent run's
      rows may end up below a raised bound; the next eviction removes them with the rest (a cache
      holding a few rows too long costs nothing but their space).
    - `complete_from_ts`: every ingested query at or after this event time is in the cache: the
      largest boundary a query run has cached from (each run writes it before its appends, and an
      eviction removes only rows older than its own boundary). A query the EventStore misses there
      does not exist yet, so the logs tier need not read raw logs for it. None: no query run yet.
      Under `dagster-daemon`, a query run's eviction may commit after a click run read this bound
      and before its lookup runs (an unpinned Delta read may see that newer version). It removes
      only queries older than its own, newer boundary. A miss the logs tier skips for that reason
      (the boundary moved more than the 5-minute slack between the two reads) stays pending until
      its lookup at the unjoinable age, once the query stream gets that far, reads the raw logs.
      Pinning the click run's `query_logs` version would close this; `photon run` runs one run at
      a time.
    """

    oldest_ts: int | None = None
    complete_from_ts: int | None = None

    @classmethod
    def load(cls, path: Path) -> "QueryCache":
        doc = read_document(path)
        return cls() if doc is None else cls(doc["oldest_ts"], doc["complete_from_ts"])

    def needs_eviction(self, boundary_ts: int) -> bool:
        return self.oldest_ts is None or self.oldest_ts < boundary_ts

    @classmethod
    def _update(cls, path: Path, change) -> "QueryCache":
        with locked(path):
            cache = cls.load(path)
            change(cache)
            write_document(path, asdict(cache))
            return cache

    @classmethod
    def caching_from(cls, path: Path, boundary_ts: int) -> None:
        """Before a work unit's appends: it caches its queries at or after `boundary_ts`."""
        def change(cache: "QueryCache") -> None:
            known = cache.complete_from_ts
            cache.complete_from_ts = boundary_ts if known is None else max(known, boundary_ts)
        cls._update(path, change)

    @classmethod
    def cached(cls, path: Path, oldest_ts: int) -> "QueryCache":
        """After a work unit's appends: it added queries from `oldest_ts` on. Returns the bounds."""
        def change(cache: "QueryCache") -> None:
            if cache.oldest_ts is not None:
                cache.oldest_ts = min(cache.oldest_ts, oldest_ts)
        return cls._update(path, change)

    @classmethod
    def scanned(cls, path: Path, oldest_ts: int) -> None:
        """An eviction scan left nothing older than `oldest_ts` in the cache."""
        def change(cache: "QueryCache") -> None:
            cache.oldest_ts = oldest_ts
        cls._update(path, change)


def durable_tier_boundary_us(progress_ts: int | None, retention_seconds: float, now_us: int | None = None) -> int | None:
    """Oldest event time the durable tier (query_logs) keeps: the query stream's progress minus the
    retention. Progress is capped at the wall clock, so a bogus future timestamp cannot empty it."""
    if progress_ts is None:
        return None
    now_us = time.time_ns() // 1000 if now_us is None else now_us
    return min(progress_ts, now_us) - int(retention_seconds * 1_000_000)
