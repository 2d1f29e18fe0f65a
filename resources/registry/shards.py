"""The sharded IdRegistry engine (Photon §2.2): registry threads, server-side batching, time-based
resharding and garbage collection, in one process.

This is the embedded registry, and the engine `registry_service.RegistryServer` puts behind Arrow
Flight. Layout of its directory:

- `meta.duckdb`: the shard configuration, rows (start_us, end_us, shards); end NULL means ∞.
- `work.duckdb`: datacenters' leases and claims on work units (resources/registry/work_claims.py).
- `shard-0000.duckdb`, ...: one DuckDB file per physical shard with `registered_ids` and a one-row
  `gc_boundary`. A configuration of n shards uses physical shards 0..n-1.

An id's shard is `stable_hash(click_id) % shards_at(timestamp_us)` (see `shard_of`), so the id stays
on the shard it was committed to however the configuration changes later (§2.2.2).

Each shard has a request queue and one registry thread that owns the shard's connection (§2.2.1).
The thread blocks for a request, drains everything queued (up to `MAX_IDS_PER_TRANSACTION` ids) and
applies the batch as one DuckDB transaction, in arrival order, resolving conflicts inside the batch
application-side: the earliest-queued commit wins an absent id. Futures are answered only after the
transaction is committed, so an answered commit is durable.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import duckdb
import numpy as np
import pyarrow as pa

from resources.event_store.memory_tier import RecentQueries
from resources.registry.api import ArrowSource, IdRegistry, read_arrow, refuse_if_replicated
from resources.registry.held_queries import QueriesHeldHere
from resources.registry.click_caps import WANTED_SCHEMA, ClickCaps
from resources.registry.work_claims import WorkClaims

log = logging.getLogger(__name__)

MAX_IDS_PER_TRANSACTION = 100_000
US_PER_DAY = 86_400_000_000

EVENTS_SCHEMA = pa.schema([("click_id", pa.string()), ("timestamp_us", pa.int64())])
LOOKUP_SCHEMA = pa.schema([("click_id", pa.string()), ("token", pa.string()), ("status", pa.string())])
COMMIT_SCHEMA = pa.schema([("click_id", pa.string()), ("status", pa.string())])
SCAN_SCHEMA = pa.schema([("click_id", pa.string()), ("timestamp_us", pa.int64()), ("token", pa.string())])

# The stable hash, vectorised: DuckDB's md5_number is the 16-byte MD5 digest of the UTF-8 string read
# as a little-endian unsigned 128-bit integer (checked against hashlib by the tests, so a DuckDB
# upgrade that changed it would be caught). Neither Python's hash() nor DuckDB's hash() is stable.
HASH_SQL = "md5_number(click_id)"

SHARD_SCHEMA = """
CREATE TABLE IF NOT EXISTS {p}registered_ids (
    click_id     VARCHAR PRIMARY KEY,
    timestamp_us BIGINT NOT NULL,
    token        VARCHAR,
    committed_at TIMESTAMP NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS {p}gc_boundary (boundary_us BIGINT NOT NULL);
"""

META_SCHEMA = "CREATE TABLE IF NOT EXISTS shard_config (start_us BIGINT NOT NULL, end_us BIGINT, shards INTEGER NOT NULL)"


class RegistryClosed(RuntimeError):
    """The registry was closed; it accepts no more requests."""


def shard_of(click_id: str, shards: int) -> int:
    """The reference definition of the shard hash: MD5 of the UTF-8 id as a little-endian integer."""
    return int.from_bytes(hashlib.md5(click_id.encode("utf-8")).digest(), "little") % shards


def now_us() -> int:
    return time.time_ns() // 1000


def as_events(events: ArrowSource) -> pa.Table:
    """The (click_id, timestamp_us) columns of any Arrow source, as a table of the registry's types."""
    return read_arrow(events, EVENTS_SCHEMA)


def split_sorted(table: pa.Table, column: str, keys: int) -> list[pa.Table]:
    """Slices of `table`, sorted by the integer `column`, for key 0..keys-1 (empty where absent)."""
    values = table.column(column).to_numpy()
    offsets = np.searchsorted(values, np.arange(keys + 1))
    rest = table.drop_columns([column])
    return [rest.slice(offsets[k], offsets[k + 1] - offsets[k]) for k in range(keys)]


@dataclass
class _Request:
    op: str  # commit | lookup | delete | clear | gc
    future: Future = field(default_factory=Future)
    events: pa.Table | None = None
    token: str | None = None
    now_us: int = 0
    # Whether its caller waits for the answer: a replica applying another's entry does not (its commit
    # statuses would be computed for nobody).
    answer: bool = True

    @property
    def ids(self) -> int:
        return 0 if self.events is None else self.events.num_rows


class ShardTables:
    """One shard's tables and the SQL that changes and reads them, on a connection it is handed:
    `registered_ids` and a one-row `gc_boundary` in `schema` (the shard's own file in this process's
    registry; a schema of the replica's one file in the replicated registry, resources/registry/replica_state.py).
    The caller owns the transaction: a group of requests is applied inside the caller's. Every time a
    change needs comes from the request (`now_us`), never from this machine's clock, so that replicas
    applying the same requests hold the same ids."""

    def __init__(self, con: duckdb.DuckDBPyConnection, schema: str | None, gc_threshold_us: int,
                 track_changes: bool = False):
        self.con = con
        self.gc_threshold_us = gc_threshold_us
        # The ids each apply added (`added`) and removed (`removed`), for a replica's digest of its id set.
        self.track_changes = track_changes
        self.added: pa.Table | None = None
        self.removed: list[pa.Table] = []
        self.prefix = f"{schema}." if schema else ""
        if schema:
            con.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        con.execute(SHARD_SCHEMA.replace("{p}", self.prefix))
        if not con.sql(f"SELECT count(*) FROM {self.prefix}gc_boundary").fetchall()[0][0]:
            con.execute(f"INSERT INTO {self.prefix}gc_boundary VALUES (0)")
        self.boundary_us: int = con.sql(f"SELECT boundary_us FROM {self.prefix}gc_boundary").fetchall()[0][0]

    def sql(self, text: str) -> str:
        return text.replace("{p}", self.prefix)

    def apply(self, group: list["_Request"]) -> list:
        """A run of same-kind requests applied, in order, inside the caller's transaction."""
        return getattr(self, f"_apply_{group[0].op}")(group)

    def _incoming(self, group: list["_Request"]) -> None:
        """Registers the group's events as `incoming` with a `seq` column: position in the group."""
        parts = [
            r.events.append_column("seq", pa.array(np.full(r.ids, i, dtype=np.int32)))
            for i, r in enumerate(group)
        ]
        self.con.register("incoming", pa.concat_tables(parts))

    def _apply_commit(self, group: list["_Request"]) -> list[pa.Table | None]:
        self._incoming(group)
        self.con.register("tokens", pa.table({"seq": pa.array(range(len(group)), pa.int32()),
                                              "token": [r.token for r in group]}))
        answered = any(r.answer for r in group)
        requested = ("SELECT i.seq, i.click_id, min(i.timestamp_us) AS timestamp_us, any_value(t.token) AS token "
                     "FROM incoming i JOIN tokens t USING (seq) GROUP BY i.seq, i.click_id")
        if answered:
            self.con.execute(f"CREATE OR REPLACE TEMP TABLE req AS {requested}")
        # Conflict resolution inside the batch: for an absent id, the earliest-queued request wins.
        # The ids registered now are kept (`added`) for the replicated registry's digest of its id set.
        insert = self.sql(
            "INSERT INTO {p}registered_ids (click_id, timestamp_us, token, committed_at) "
            "SELECT click_id, arg_min(timestamp_us, seq), arg_min(token, seq), make_timestamp($now) "
            f"FROM {'req' if answered else f'({requested})'} "
            "WHERE timestamp_us >= $b GROUP BY click_id ON CONFLICT DO NOTHING")
        params = {"b": self.boundary_us, "now": group[0].now_us}
        if self.track_changes:
            self.added = self.con.sql(insert + " RETURNING md5_number_lower(click_id) AS hash", params=params).to_arrow_table()
        else:
            self.con.execute(insert, params)
        if not answered:
            self.con.unregister("incoming")
            self.con.unregister("tokens")
            return [None] * len(group)
        return self._answers(
            group, "SELECT q.seq, q.click_id, CASE WHEN q.timestamp_us < $b THEN 'too_old' "
            "WHEN r.token = q.token THEN 'held' ELSE 'refused' END AS status "
            "FROM req q LEFT JOIN {p}registered_ids r USING (click_id) ORDER BY q.seq", "incoming", "tokens")

    def _apply_lookup(self, group: list["_Request"]) -> list[pa.Table]:
        self._incoming(group)
        return self._answers(group, LOOKUP_SQL, "incoming")

    def lookup(self, events: pa.Table, cursor: duckdb.DuckDBPyConnection) -> pa.Table:
        """A lookup through a cursor of its own (a reader beside the connection that applies)."""
        cursor.register("incoming", events.append_column("seq", pa.array(np.zeros(events.num_rows, dtype=np.int32))))
        try:
            result = cursor.sql(self.sql(LOOKUP_SQL), params={"b": self.boundary_us}).to_arrow_table()
        finally:
            cursor.unregister("incoming")
        return result.drop_columns(["seq"])

    def _answers(self, group: list["_Request"], sql: str, *registered: str) -> list[pa.Table]:
        """Each request's answer: `sql` (ordered by `seq`, with the GC boundary as $b) split by
        request; the relations `registered` for it are then dropped."""
        result = self.con.sql(self.sql(sql), params={"b": self.boundary_us}).to_arrow_table()
        for name in registered:
            self.con.unregister(name)
        return split_sorted(result, "seq", len(group))

    def _apply_delete(self, group: list["_Request"]) -> list[int]:
        answers, self.removed = [], []
        for request in group:
            self.con.register("doomed", request.events)
            gone = self.con.sql(self.sql(
                "DELETE FROM {p}registered_ids WHERE click_id IN (SELECT click_id FROM doomed) "
                "RETURNING md5_number_lower(click_id) AS hash"
            )).to_arrow_table()
            self.con.unregister("doomed")
            self.removed.append(gone)
            answers.append(gone.num_rows)
        return answers

    def _apply_clear(self, group: list["_Request"]) -> list[int]:
        return [
            self.con.sql(self.sql("UPDATE {p}registered_ids SET token = NULL WHERE token = $t"),
                         params={"t": r.token}).fetchall()[0][0]
            for r in group
        ]

    def _apply_gc(self, group: list["_Request"]) -> list[dict]:
        """Advances the GC boundary to min(now, newest committed timestamp) - threshold, never back."""
        answers, self.removed = [], []
        for request in group:
            newest = self.con.sql(self.sql("SELECT max(timestamp_us) FROM {p}registered_ids")).fetchall()[0][0]
            deleted = 0
            if newest is not None:
                proposal = min(request.now_us, newest) - self.gc_threshold_us
                if proposal > self.boundary_us:
                    self.con.execute(self.sql("UPDATE {p}gc_boundary SET boundary_us = $b"), {"b": proposal})
                    gone = self.con.sql(self.sql(
                        "DELETE FROM {p}registered_ids WHERE timestamp_us < $b RETURNING md5_number_lower(click_id) AS hash"),
                        params={"b": proposal}).to_arrow_table()
                    self.removed.append(gone)
                    deleted = gone.num_rows
                    self.boundary_us = proposal
            answers.append({"boundary_us": self.boundary_us, "deleted": deleted})
        return answers

    def reload_boundary(self) -> None:
        """The boundary as stored (after a rolled-back transaction moved it in memory)."""
        self.boundary_us = self.con.sql(self.sql("SELECT boundary_us FROM {p}gc_boundary")).fetchall()[0][0]


LOOKUP_SQL = (
    "SELECT q.seq, q.click_id, CASE WHEN q.timestamp_us < $b THEN NULL ELSE r.token END AS token, "
    "CASE WHEN q.timestamp_us < $b THEN 'too_old' ELSE 'registered' END AS status "
    "FROM (SELECT seq, click_id, min(timestamp_us) AS timestamp_us FROM incoming GROUP BY seq, click_id) q "
    "LEFT JOIN {p}registered_ids r USING (click_id) "
    "WHERE q.timestamp_us < $b OR r.click_id IS NOT NULL ORDER BY q.seq"
)


class _Shard:
    """One physical shard of this process's registry: its DuckDB file, request queue and registry thread."""

    def __init__(self, index: int, path: Path, gc_threshold_us: int):
        self.index = index
        self.con = duckdb.connect(str(path))
        self.tables = ShardTables(self.con, None, gc_threshold_us)
        # Stats and scans read through their own connection so they never wait for the thread.
        self.reader = self.con.cursor()
        self.reader_lock = threading.Lock()
        self.queue: collections.deque[_Request] = collections.deque()
        self.cond = threading.Condition()
        self.closing = False
        self.gate = threading.Event()  # cleared by ShardedIdRegistry.paused() (tests)
        self.gate.set()
        self.requests_received = 0
        self.transactions = 0
        self.ids_in_transactions = 0
        self.requests_in_transactions = 0
        self.max_ids_per_transaction = 0
        self.thread = threading.Thread(target=self._run, name=f"registry-thread-{index}", daemon=True)
        self.thread.start()

    @property
    def boundary_us(self) -> int:
        return self.tables.boundary_us

    def submit(self, request: _Request) -> Future:
        with self.cond:
            if self.closing:
                raise RegistryClosed("the registry is closed")
            self.queue.append(request)
            self.requests_received += 1
            self.cond.notify()
        return request.future

    def close(self) -> None:
        with self.cond:
            self.closing = True
            self.cond.notify()
        self.gate.set()
        self.thread.join()
        self.reader.close()
        self.con.close()

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.closing:
                    self.cond.wait()
                if not self.queue:
                    return
            self.gate.wait()
            with self.cond:
                batch = [self.queue.popleft()]
                ids = batch[0].ids
                while self.queue and ids + self.queue[0].ids <= MAX_IDS_PER_TRANSACTION:
                    batch.append(self.queue.popleft())
                    ids += batch[-1].ids
            self._apply(batch, ids)

    def _apply(self, batch: list[_Request], ids: int) -> None:
        now = now_us()
        for request in batch:
            request.now_us = request.now_us or now
        try:
            self.con.execute("BEGIN TRANSACTION")
            answers: list = []
            for group in _consecutive(batch):
                answers.extend(self.tables.apply(group))
            self.con.execute("COMMIT")
        except BaseException as error:
            with contextlib.suppress(duckdb.Error):
                self.con.execute("ROLLBACK")
            self.tables.reload_boundary()
            for request in batch:
                request.future.set_exception(error)
            if not isinstance(error, Exception):
                raise
            return
        self.transactions += 1
        self.ids_in_transactions += ids
        self.requests_in_transactions += len(batch)
        self.max_ids_per_transaction = max(self.max_ids_per_transaction, ids)
        for request, answer in zip(batch, answers):
            request.future.set_result(answer)

    def counts(self) -> tuple[int, int]:
        with self.reader_lock:
            return self.reader.sql("SELECT count(*), count(token) FROM registered_ids").fetchall()[0]

    def scan(self) -> pa.Table:
        with self.reader_lock:
            return self.reader.sql("SELECT click_id, timestamp_us, token FROM registered_ids").to_arrow_table()

    def counters(self) -> dict:
        """The shard's request and transaction counters (kept in memory: no query)."""
        transactions = self.transactions
        return {
            "shard": self.index,
            "requests_received": self.requests_received,
            "transactions": transactions,
            "ids_in_transactions": self.ids_in_transactions,
            "requests_in_transactions": self.requests_in_transactions,
            "ids_per_transaction_mean": self.ids_in_transactions / transactions if transactions else 0.0,
            "ids_per_transaction_max": self.max_ids_per_transaction,
            "requests_per_transaction_mean": self.requests_in_transactions / transactions if transactions else 0.0,
            "gc_boundary_us": self.boundary_us,
        }

    def stats(self) -> dict:
        """The counters and the ids the shard holds (counted: a scan of the shard's table)."""
        ids, tokened = self.counts()
        return {**self.counters(), "ids_registered": ids, "ids_with_token": tokened}


def route(events: pa.Table, config: list[tuple], hasher: duckdb.DuckDBPyConnection) -> dict[int, pa.Table]:
    """The rows of `events` (click_id, timestamp_us and any other columns) of each shard, by the shard
    configuration (start_us, end_us, shards) in force at each id's timestamp; `hasher` is a DuckDB
    connection the caller does not use meanwhile."""
    if all(n == 1 for _, _, n in config):
        return {0: events}
    cases = " ".join(f"WHEN timestamp_us < {e} THEN {HASH_SQL} % {n}" for _, e, n in config[:-1])
    shard_sql = f"CASE {cases} ELSE {HASH_SQL} % {config[-1][2]} END" if cases else f"{HASH_SQL} % {config[-1][2]}"
    hasher.register("events", events)
    try:
        routed = hasher.sql(f"SELECT *, ({shard_sql})::INTEGER AS shard FROM events ORDER BY shard").to_arrow_table()
    finally:
        hasher.unregister("events")
    parts = split_sorted(routed, "shard", max(n for _, _, n in config))
    return {index: part for index, part in enumerate(parts) if part.num_rows}


def _consecutive(batch: list[_Request]) -> Iterator[list[_Request]]:
    """Runs of same-kind requests; commits and lookups in a run are applied as one statement each."""
    run: list[_Request] = []
    for request in batch:
        if run and request.op != run[0].op:
            yield run
            run = []
        run.append(request)
    if run:
        yield run


class ShardedIdRegistry(QueriesHeldHere, IdRegistry):
    """The IdRegistry of Photon §2 in this process: `shards` DuckDB files, one registry thread each.

    A request whose ids fall on several shards is split by shard, the parts are applied in parallel
    by the shards' threads, and the answers are concatenated. As in Photon, such a request is not
    atomic across shards: each shard's part commits on its own.

    `shards` applies only when the directory is new; afterwards the stored configuration wins and
    only `reshard` changes it. Ids older than a shard's GC boundary (see `collect_garbage`) are
    answered 'too_old' and never registered. A background thread runs a GC pass every
    `gc_interval_seconds` (None: only on `collect_garbage`).
    """

    def __init__(
        self,
        directory: Path,
        shards: int = 1,
        gc_threshold_days: float = 3.0,
        max_clock_skew_seconds: float = 60.0,
        gc_interval_seconds: float | None = 60.0,
    ):
        if shards < 1:
            raise ValueError(f"shards must be at least 1, got {shards}")
        refuse_if_replicated(directory)
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.gc_threshold_days = gc_threshold_days
        self.gc_threshold_us = int(gc_threshold_days * US_PER_DAY)
        self.max_clock_skew_us = int(max_clock_skew_seconds * 1_000_000)
        self._meta = duckdb.connect(str(self.directory / "meta.duckdb"))
        self._meta.execute(META_SCHEMA)
        self._config_lock = threading.Lock()
        self._config = self._meta.sql("SELECT start_us, end_us, shards FROM shard_config ORDER BY start_us").fetchall()
        if not self._config:
            self._meta.execute("INSERT INTO shard_config VALUES (0, NULL, $n)", {"n": shards})
            self._config = [(0, None, shards)]
        elif shards != self._config[-1][2]:
            log.warning("registry %s keeps its stored shard configuration %s; ignoring shards=%d",
                        self.directory, self.configuration(), shards)
        self._work = WorkClaims.open(self.directory / "work.duckdb")
        self._caps = ClickCaps.open(self.directory / "caps.duckdb")
        self._recent = RecentQueries()
        self._shards: dict[int, _Shard] = {}
        self._shards_lock = threading.Lock()
        self._closed = False
        # Routing hashes on cursors of one in-memory database: a new connection costs ~30 ms.
        self._hasher = duckdb.connect()
        self._hasher_lock = threading.Lock()
        for index in range(max(n for _, _, n in self._config)):
            self._shard(index)
        self._stop_gc = threading.Event()
        self._gc_thread = None
        if gc_interval_seconds is not None:
            self._gc_thread = threading.Thread(
                target=self._gc_loop, args=(gc_interval_seconds,), name="registry-gc", daemon=True
            )
            self._gc_thread.start()

    def _shard(self, index: int) -> _Shard:
        with self._shards_lock:
            if self._closed:
                raise RegistryClosed("the registry is closed")
            if index not in self._shards:
                path = self.directory / f"shard-{index:04d}.duckdb"
                self._shards[index] = _Shard(index, path, self.gc_threshold_us)
            return self._shards[index]

    def configuration(self) -> list[dict]:
        return [{"start_us": s, "end_us": e, "shards": n} for s, e, n in self._config]

    def _route(self, events: pa.Table) -> dict[int, pa.Table]:
        """The events of each shard, by the configuration in force at each id's timestamp."""
        with self._hasher_lock:
            hasher = self._hasher.cursor()
        try:
            return route(events, self._config, hasher)
        finally:
            hasher.close()

    def _fan_out(self, op: str, events: pa.Table, token: str | None = None) -> list:
        futures = [
            self._shard(index).submit(_Request(op, events=part, token=token))
            for index, part in self._route(events).items()
        ]
        return [f.result() for f in futures]

    def lookup(self, events: ArrowSource) -> pa.Table:
        return pa.concat_tables([LOOKUP_SCHEMA.empty_table(), *self._fan_out("lookup", as_events(events))])

    def commit(self, events: ArrowSource, token: str) -> pa.Table:
        if not token:
            raise ValueError("commit needs a non-empty token")
        return pa.concat_tables([COMMIT_SCHEMA.empty_table(), *self._fan_out("commit", as_events(events), token)])

    def delete(self, events: ArrowSource) -> int:
        return sum(self._fan_out("delete", as_events(events)))

    def clear_tokens(self, token: str) -> int:
        futures = [shard.submit(_Request("clear", token=token)) for shard in self._all_shards()]
        return sum(f.result() for f in futures)

    def _all_shards(self) -> list[_Shard]:
        with self._shards_lock:
            return [self._shards[i] for i in sorted(self._shards)]

    def scan(self) -> pa.RecordBatchReader:
        shards = self._all_shards()

        def batches() -> Iterator[pa.RecordBatch]:
            for shard in shards:
                yield from shard.scan().cast(SCAN_SCHEMA).to_batches()

        return pa.RecordBatchReader.from_batches(SCAN_SCHEMA, batches())

    def counters(self) -> dict:
        return self._summary([shard.counters() for shard in self._all_shards()])

    def stats(self) -> dict:
        return self._summary([shard.stats() for shard in self._all_shards()], ("ids_registered", "ids_with_token"))

    def _summary(self, shards: list[dict], counted: tuple[str, ...] = ()) -> dict:
        total = {key: sum(s[key] for s in shards) for key in (
            "requests_received", "transactions", "ids_in_transactions", "requests_in_transactions", *counted)}
        transactions = total["transactions"]
        total["ids_per_transaction_mean"] = total["ids_in_transactions"] / transactions if transactions else 0.0
        total["ids_per_transaction_max"] = max((s["ids_per_transaction_max"] for s in shards), default=0)
        total["requests_per_transaction_mean"] = (
            total["requests_in_transactions"] / transactions if transactions else 0.0)
        return {
            "total": total,
            "shards": shards,
            "configuration": self.configuration(),
            "gc_threshold_days": self.gc_threshold_days,
            "recent_queries": self._recent.stats(),
        }

    def reshard(self, shards: int, effective_at_us: int | None = None) -> list[dict]:
        """From `effective_at_us` (default now + max clock skew) on, new ids use `shards` shards.

        The time must be at least now + skew, so that no id already committed can have a timestamp
        the new configuration covers (Photon §2.2.2)."""
        if shards < 1:
            raise ValueError(f"shards must be at least 1, got {shards}")
        earliest = now_us() + self.max_clock_skew_us
        effective = earliest if effective_at_us is None else effective_at_us
        with self._config_lock:
            last_start = self._config[-1][0]
            if effective < earliest:
                raise ValueError(f"effective time {effective} us is earlier than now + max clock skew ({earliest} us)")
            if effective < last_start:
                raise ValueError(f"effective time {effective} us is earlier than the current configuration's start {last_start} us")
            for index in range(shards):
                self._shard(index)
            self._meta.execute("BEGIN TRANSACTION")
            self._meta.execute("UPDATE shard_config SET end_us = $t WHERE end_us IS NULL", {"t": effective})
            self._meta.execute("INSERT INTO shard_config VALUES ($t, NULL, $n)", {"t": effective, "n": shards})
            self._meta.execute("COMMIT")
            *kept, (start, _, n) = self._config
            self._config = [*kept, (start, effective, n), (effective, None, shards)]
        log.info("registry %s resharded: %s", self.directory, self.configuration())
        return self.configuration()

    def heartbeat(self, dc: str | None, ttl_seconds: float) -> dict[str, float | None]:
        return self._work.heartbeat(dc, ttl_seconds)

    def claim_work(self, dc: str, stream: str, units: list[dict]) -> int:
        return self._work.claim(dc, stream, units)

    def finish_work(self, unit: str, pending: bool) -> int:
        return self._work.finish(unit, pending)

    def work_claims(self, stream: str, files: list[str]) -> list[dict]:
        return self._work.claims(stream, files)

    def grant_clicks(self, wanted: ArrowSource, token: str, cap: int) -> pa.Table:
        return self._caps.grant(read_arrow(wanted, WANTED_SCHEMA), token, cap)

    def collect_garbage(self) -> dict:
        """One GC pass on every shard now; returns each shard's boundary and how many ids it deleted."""
        now = now_us()
        shards = self._all_shards()
        answers = [f.result() for f in [s.submit(_Request("gc", now_us=now)) for s in shards]]
        return {
            "boundaries_us": {str(s.index): a["boundary_us"] for s, a in zip(shards, answers)},
            "deleted": {str(s.index): a["deleted"] for s, a in zip(shards, answers)},
        }

    def _gc_loop(self, interval: float) -> None:
        while not self._stop_gc.wait(interval):
            try:
                self.collect_garbage()
            except RegistryClosed:
                return
            except Exception:
                log.exception("registry %s: garbage collection failed", self.directory)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Holds every registry thread before it drains its queue (tests use it to fill one batch)."""
        shards = self._all_shards()
        for shard in shards:
            shard.gate.clear()
        try:
            yield
        finally:
            for shard in shards:
                shard.gate.set()

    def close(self) -> None:
        """Stops accepting requests, applies the queued ones, joins the threads, closes the files."""
        self._stop_gc.set()
        if self._gc_thread is not None:
            self._gc_thread.join()
        with self._shards_lock:
            if self._closed:
                return
            self._closed = True
            shards = list(self._shards.values())
        for shard in shards:
            shard.close()
        self._meta.close()
        self._work.close()
        self._caps.close()
        self._hasher.close()
