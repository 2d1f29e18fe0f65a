"""The EventStore's memory tier (Photon §3.4.1, the CacheEventStore): the recent query lines of each
datacenter, held by a long-lived process and looked up by query id.

It lives in the registry service (resources/registry/service.py), the one process that outlives
every run in both deployments: `photon run` executes runs in its own process, but under `photon up`
each run is a process of its own, and only a service they all call can serve them from memory. (A
Spark cache on the Connect server would be shared too, but a click batch joined against a few
million cached rows costs ~0.7 s, and ~5 s once the rows are spread over a piece per pass; a lookup
here costs tens of milliseconds: docs/STACK.md.)

Query runs put their work unit's valid query lines here before they append them to `query_logs`
(the durable tier) and record the writers' progress; a click run's executors look their clicks'
query ids up here first. What is held is bounded by bytes. Pieces whose newest query is more than
`retention_seconds` behind the datacenter's newest, and then, over the bytes, the oldest pieces,
give up their lines and keep only where each line lies in the raw logs (file, offset, length: ~60
bytes a query against ~400 with the line); only then, over the bytes, do the oldest leave. The
lookup reads a located query's line from the log itself (`read_located`), a seek and a read in the
click run's own task, instead of a search of the durable tier by Spark jobs (~4-5 s a click run,
however few the clicks; ~30 s for a backlog's hour of event time). Everything is lost when the
process ends; the durable tiers answer then.

The horizon makes a miss conclusive. Every query ingested after this process started holds its put
(a query run puts before it records progress), and pieces leave only by eviction. So the horizon of
a datacenter is the newest query-id time it may lack: the query stream's progress when its first
piece came (earlier work units were ingested before this process held anything), raised by each
eviction to the evicted piece's newest. A query whose id names a later time, from a writer ingested
past that time, that is not here, was never ingested. Unknown (None) until a first put: nothing is
conclusive then.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# A query line, its timestamp (what the joiner judges a click by without parsing the line) and where
# the line lies in the datacenter's query logs. A located query (its piece gave its lines up) has a
# null line.
PIECE_SCHEMA = pa.schema([pa.field("query_id", pa.string()), pa.field("timestamp_us", pa.int64()),
                         pa.field("line", pa.string()), pa.field("file", pa.string()),
                         pa.field("offset", pa.int64()), pa.field("length", pa.int64())])
WANTED_SCHEMA = pa.schema([pa.field("query_id", pa.string())])


def id_times(query_ids: pa.Array) -> pa.Array:
    """The time each query id names (`<server_ip>:<process_id>:<timestamp_us>`; ids that do not
    have this form give null)."""
    parts = pc.extract_regex(query_ids, r":(?P<ts>[0-9]+)$")
    return pc.cast(pc.struct_field(parts, "ts"), pa.int64())


@dataclass
class Piece:
    """One work unit's query lines (or one partition's of them: a unit's tasks put separately), in the
    order of the times their ids name (`id_ts`, the index a lookup searches: see `rows_of`)."""

    table: pa.Table  # PIECE_SCHEMA, `file` dictionary-encoded; without `line` once located
    min_ts: int  # the times its query ids name
    max_ts: int
    id_ts: np.ndarray  # the time each row's query id names, ascending (int64)
    # Computed once: every put sums the pieces' sizes (a tailer puts twice a second, and a
    # datacenter holds a thousand pieces; summing their buffers each time took a tenth of a core).
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.nbytes = self.table.nbytes + self.id_ts.nbytes

    @classmethod
    def of(cls, rows: pa.Table, times: pa.Array) -> "Piece":
        """A piece of `rows` (PIECE_SCHEMA, every query id naming a time: `times`), sorted by those times."""
        order = pc.sort_indices(times)
        id_ts = times.take(order).to_numpy()
        return cls(rows.take(order).combine_chunks(), int(id_ts[0]), int(id_ts[-1]), id_ts)

    @property
    def located(self) -> bool:
        return "line" not in self.table.column_names

    def without_lines(self) -> "Piece":
        return Piece(self.table.drop_columns(["line"]), self.min_ts, self.max_ts, self.id_ts)

    def rows_of(self, ids: pa.Array, ids_ts: np.ndarray) -> pa.Table | None:
        """Its rows of these query ids (`ids_ts`: the time each names), as they are held (`file`
        dictionary-encoded; no `line` once located; None: none): the rows whose id names the same
        time, found by binary search, then compared whole. A scan of the piece's ids against the wanted
        ones (`is_in`) cost each lookup the rows of every piece its times overlap: half of the registry
        service's CPU beside a live stream at 1,000 clicks/s, a piece a tailer's put, twice a second
        (py-spy, 2026-12-01)."""
        low = np.searchsorted(self.id_ts, ids_ts, "left")
        lengths = np.searchsorted(self.id_ts, ids_ts, "right") - low
        some = np.flatnonzero(lengths)
        if not len(some):
            return None
        if (lengths[some] == 1).all():  # one row of each time: nearly always
            rows, wanted = low[some], some
        else:  # every (wanted id, row of the same time) pair
            lengths = lengths[some]
            wanted = np.repeat(some, lengths)
            rows = np.repeat(low[some], lengths) + np.arange(len(wanted)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        rows = pa.array(rows)
        same = pc.equal(self.table["query_id"].take(rows), ids.take(pa.array(wanted)))
        return self.table.take(rows.filter(same))


@dataclass
class _Datacenter:
    pieces: OrderedDict = field(default_factory=OrderedDict)  # (unit, attempt, part, kind) -> Piece, oldest first
    horizon_ts: int | None = None  # see the module docstring; None: unknown
    started: bool = False
    newest_ts: int | None = None
    hits: int = 0
    misses: int = 0
    evicted_rows: int = 0
    # Set once a query tailer feeds this datacenter (photon/query_tail.py): where it has read each
    # query log to, and per writer the newest query time it has put (see `put_tailed`).
    tail: dict | None = None

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.pieces.values())

    @property
    def rows(self) -> int:
        return sum(p.table.num_rows for p in self.pieces.values())

    @property
    def located_rows(self) -> int:
        return sum(p.table.num_rows for p in self.pieces.values() if p.located)


@dataclass(frozen=True)
class Holding:
    """How the memory tier holds a put's lines: queries whose ids name a time after `latest_valid_ts`
    are from the future (held apart, see RecentQueries.put); pieces more than `retention_seconds`
    behind the newest query, and the oldest past `budget_bytes`, are evicted."""

    latest_valid_ts: int
    retention_seconds: float
    budget_bytes: int

    @classmethod
    def of(cls, doc: dict) -> "Holding":
        """From the JSON of a registry call (a put's command, or a tailer's `tail`)."""
        return cls(int(doc["latest_valid_ts"]), float(doc["retention_seconds"]), int(doc["budget_bytes"]))


class TierLost(RuntimeError):
    """A tailer's put does not continue what this memory tier holds of its datacenter: the tier it fed
    is gone (its process died, or the tailer's client moved to another replica of the registry). The
    tailer starts over from the logs' first byte; the tier meanwhile vouches for no miss."""


class RecentQueries:
    """Thread-safe; every call is short (Arrow compute over the pieces, no per-row Python)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._dcs: dict[str, _Datacenter] = {}

    def put(self, dc: str, unit: str, attempt: int, part: int, queries: pa.Table, ingested_before_ts: int | None,
            holding: Holding) -> dict:
        """Holds one task's share of a work unit's query lines (`queries`: PIECE_SCHEMA). A later
        attempt of the unit replaces an earlier one's pieces; the same task again replaces its own.
        `ingested_before_ts`: the query stream's progress before this unit (None: nothing ingested);
        `holding.latest_valid_ts`: queries whose ids name a later time are from the future (spark_ops/validity.py):
        they are held in a piece of their own that moves neither the eviction clock nor, while held,
        the horizon (one such query would hold every other piece for hours); it is the last to
        leave by bytes. A miss for one is then not wrongly conclusive once progress passes it."""
        table = queries.select(PIECE_SCHEMA.names).cast(PIECE_SCHEMA)
        # A piece's lines come from a few files: their names once each.
        table = table.set_column(3, "file", pc.dictionary_encode(table["file"]))
        times = id_times(table["query_id"])
        # A query id that names no time is not of the contract's form: the parsers quarantine it.
        named = pc.is_valid(times)
        table, times = table.filter(named), times.filter(named)
        now = pc.less_equal(times, holding.latest_valid_ts)
        pieces = {kind: Piece.of(table.filter(keep), times.filter(keep))
                  for kind, keep in (("valid", now), ("future", pc.invert(now))) if pc.any(keep).as_py()}
        with self._lock:
            held = self._dcs.setdefault(dc, _Datacenter())
            if not held.started:
                held.started = True
                held.horizon_ts = -1 if ingested_before_ts is None else ingested_before_ts
            for key in [k for k in held.pieces if k[0] == unit and k[1] != attempt]:
                held.pieces.pop(key)  # nothing of an earlier attempt is kept: it could differ
            for kind, piece in pieces.items():
                held.pieces[(unit, attempt, part, kind)] = piece
                held.pieces.move_to_end((unit, attempt, part, kind))
                if kind == "valid":
                    held.newest_ts = piece.max_ts if held.newest_ts is None else max(held.newest_ts, piece.max_ts)
            evicted = self._evict(held, int(holding.retention_seconds * 1e6), holding.budget_bytes)
            return {"rows": held.rows, "bytes": held.nbytes, "evicted_pieces": evicted}

    def put_tailed(self, dc: str, queries: pa.Table, tail: dict, holding: Holding) -> dict:
        """Holds the lines a query tailer read since its last put, and records with them, under the
        same lock, where it has read each file to and each writer's newest query time (`tail`:
        {"part", "offsets", "writers"}; "offsets" of the files this put read only, added to those
        recorded: a live stream's query logs gain ~13 files a second, and sending every file's offset
        with each put, twice a second, made the put's JSON grow by the minute). The tailer puts a writer's lines in log order before it
        raises that writer's time, so a query of a writer at or below it, above the horizon, that is
        not here, was never logged: that is what a click lookup vouches by once a tailer feeds the
        datacenter. Its pieces are keyed by the part number it counts up; a tailer that restarts
        reads `tail_state` and goes on from there. The state lives and dies with the pieces (this
        process): a fresh one has none, and the tailer starts over from the logs' first byte. A put
        that does not continue the parts held (the first must be part 1; then the same part again, a
        retry, or the next) raises TierLost: its writers' times would vouch for queries this tier never
        held."""
        part = int(tail["part"])
        with self._lock:
            held = self._dcs.get(dc)
            last = None if held is None or held.tail is None else held.tail["part"]
        if (part != 1) if last is None else (part not in (last, last + 1)):
            raise TierLost(f"memory tier lost: the query tailer of {dc} put part {part}, this tier holds "
                           f"{'none' if last is None else f'up to part {last}'}")
        counts = self.put(dc, "tail", 1, part, queries, None, holding)
        with self._lock:
            held = self._dcs[dc]
            offsets = {} if held.tail is None else held.tail["offsets"]
            offsets.update(tail["offsets"])
            held.tail = {"part": int(tail["part"]), "offsets": offsets, "writers": dict(tail["writers"])}
        return counts

    def tail_state(self, dc: str, offsets: bool = True) -> dict | None:
        """What the tailer of `dc` recorded with its puts (see put_tailed), without where it read each
        file to unless `offsets` (a click lookup needs the writers' times only); None: no tailer fed it."""
        with self._lock:
            held = self._dcs.get(dc)
            if held is None or held.tail is None:
                return None
            return {"part": held.tail["part"], "writers": dict(held.tail["writers"]),
                    **({"offsets": dict(held.tail["offsets"])} if offsets else {})}

    @staticmethod
    def _evict(held: _Datacenter, retention_us: int, budget_bytes: int) -> int:
        """Pieces past the retention give up their lines; then, while over the budget, the oldest give
        up theirs, and only then the oldest leave. A located query costs ~60 bytes, so the budget holds
        millions: a backlog of an hour of event time is still answered from here. Oldest by event
        time: a piece of a late shipment may be put after newer ones. Returns the pieces that left."""
        order = sorted(held.pieces, key=lambda k: held.pieces[k].max_ts)
        total = held.nbytes
        oldest_lined = None if held.newest_ts is None else held.newest_ts - retention_us
        for key in order:
            piece = held.pieces[key]
            past = oldest_lined is not None and piece.max_ts < oldest_lined
            if not (past or total > budget_bytes):
                break
            if not piece.located:
                held.pieces[key] = piece.without_lines()
                total -= piece.nbytes - held.pieces[key].nbytes
        gone = []
        for key in order:
            if total <= budget_bytes:
                break
            piece = held.pieces.pop(key)
            total -= piece.nbytes
            held.horizon_ts = max(held.horizon_ts, piece.max_ts)
            held.evicted_rows += piece.table.num_rows
            gone.append(key)
        return len(gone)

    def get(self, dc: str, wanted: pa.Table) -> pa.Table:
        """The held queries (PIECE_SCHEMA; `line` null for a located one) of the wanted query ids, once
        each."""
        ids = wanted.column("query_id").combine_chunks()
        with self._lock:
            held = self._dcs.get(dc)
            pieces = list(held.pieces.values()) if held else []
        unique = pc.unique(ids.drop_null()) if len(ids) else ids
        times = id_times(unique)
        named = pc.is_valid(times)  # an id that names no time is never held (put)
        by_time = pc.sort_indices(times.filter(named))
        wanted_ids, wanted_ts = unique.filter(named).take(by_time), times.filter(named).take(by_time).to_numpy()
        found = []
        for piece in pieces:
            # A piece whose times hold none of the wanted ids' cannot hold them.
            within = slice(np.searchsorted(wanted_ts, piece.min_ts, "left"), np.searchsorted(wanted_ts, piece.max_ts, "right"))
            if within.start == within.stop:
                continue
            hit = piece.rows_of(wanted_ids[within], wanted_ts[within])
            if hit is not None and hit.num_rows:
                found.append(hit if "line" in hit.column_names else
                             hit.add_column(2, "line", pa.nulls(hit.num_rows, pa.string())))
        # One cast for them all: `file` is each piece's dictionary.
        table = pa.concat_tables(found).cast(PIECE_SCHEMA) if found else PIECE_SCHEMA.empty_table()
        if table.num_rows:
            # A query line logged twice is one query: keep its first copy.
            first = pc.equal(pc.index_in(table["query_id"], value_set=table["query_id"]),
                             pa.array(range(table.num_rows), pa.int32()))
            table = table.filter(first)
        with self._lock:
            if held is not None:
                held.hits += table.num_rows
                held.misses += len(unique) - table.num_rows
        return table

    def horizon(self, dc: str) -> int | None:
        with self._lock:
            held = self._dcs.get(dc)
            return held.horizon_ts if held else None

    def stats(self) -> dict:
        with self._lock:
            return {dc: {"rows": h.rows, "located_rows": h.located_rows, "bytes": h.nbytes, "pieces": len(h.pieces),
                         "horizon_ts": h.horizon_ts, "newest_ts": h.newest_ts, "hits": h.hits, "misses": h.misses,
                         "evicted_rows": h.evicted_rows, "tailed": h.tail is not None}
                    for dc, h in self._dcs.items()}


def read_located(recalled: pa.Table, query_dir: Path, max_line_bytes: int) -> pa.Table:
    """`recalled` (PIECE_SCHEMA) with the line of each located query read from the query logs under
    `query_dir` (one open per file). The logs are never rewritten: a line that is not there any more
    is an error, never a miss (a miss the horizon vouches for would make its click unjoinable)."""
    missing = pc.and_(pc.is_null(recalled["line"]), pc.is_valid(recalled["file"]))
    if not pc.any(missing).as_py():
        return recalled
    lines = recalled["line"].to_pylist()
    files, offsets, lengths, ids = (recalled[c].to_pylist() for c in ("file", "offset", "length", "query_id"))
    by_file: dict[str, list[int]] = {}
    for i in pc.indices_nonzero(missing).to_pylist():
        by_file.setdefault(files[i], []).append(i)
    for file, rows in by_file.items():
        with open(query_dir / file, "rb") as f:
            for i in rows:
                f.seek(offsets[i])
                raw = f.read(min(lengths[i], max_line_bytes + 1)).rstrip(b"\n")
                if ids[i].encode() not in raw and b"\\" not in raw:
                    raise ValueError(f"query {ids[i]} is not at {file}:{offsets[i]} any more: "
                                     "the query logs were rewritten under the EventStore's memory tier")
                lines[i] = raw.decode("utf-8")
    return recalled.set_column(2, "line", pa.array(lines, pa.string()))
