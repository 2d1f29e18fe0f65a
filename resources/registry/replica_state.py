"""The replicated registry's state machine (Photon §2.1: every replica builds its store from the same
sequence of committed values): one replica's durable state in one DuckDB file, changed only by
applying the log's entries (resources/registry/log_entries.py) in revision order.

`<replica dir>/registry.duckdb` holds, in one file so that one transaction covers them all:
- per shard a schema `shard_NNNN` with `registered_ids` and `gc_boundary` (resources/registry/shards.py:
  ShardTables, the same SQL as the registry of one machine) and the shard configuration;
- the datacenters' leases and work claims (resources/registry/work_claims.py), the click-cap grants
  (resources/registry/click_caps.py);
- `applied`: the revision of the last entry applied, written in the same transaction as its effect,
  so a replica killed at any point restarts exactly after the last entry it applied;
- `applied_requests`: the request ids applied in the last hour of entry time, with small answers: an
  op whose request was applied already (a put repeated after its answer was lost, a client's retry
  through another replica) changes nothing again;
- `id_digest`: after each entry that changed the id set, its count and the sum (mod 2^64) of the
  ids' MD5 (lower 64 bits): two replicas at the same revision hold the same ids exactly when these
  agree (the `registry_replicas_agree` check compares them).

Applying reads no clock: every time an op needs is the entry's `at_us`, stamped by its proposer. So
two replicas that applied the same entries give the same answers to the same reads.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Iterator

import duckdb
import numpy as np
import pyarrow as pa

from resources.registry.click_caps import ClickCaps
from resources.registry.log_entries import Entry, Op
from resources.registry.shards import (COMMIT_SCHEMA, LOOKUP_SCHEMA, SCAN_SCHEMA, US_PER_DAY, ShardTables, _Request,
                                       route)
from resources.registry.work_claims import WorkClaims

STATE_FILE = "registry.duckdb"
DEDUPE_WINDOW_US = 3_600_000_000  # request ids remembered for an hour of entry time, digests too
PRUNE_EVERY_US = 60_000_000  # what is older than that window goes once a minute of entry time

STATE_SCHEMA = """
CREATE TABLE IF NOT EXISTS applied (revision BIGINT NOT NULL, at_us BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS applied_requests (
    request_id VARCHAR PRIMARY KEY, revision BIGINT NOT NULL, at_us BIGINT NOT NULL, answer VARCHAR);
CREATE TABLE IF NOT EXISTS shard_config (start_us BIGINT NOT NULL, end_us BIGINT, shards INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS id_digest (
    revision BIGINT PRIMARY KEY, ids BIGINT NOT NULL, hash_sum UBIGINT NOT NULL, at_us BIGINT NOT NULL);
"""
MASK = (1 << 64) - 1
IMPORT_IDS = pa.schema([("click_id", pa.string()), ("timestamp_us", pa.int64()), ("token", pa.string())])


class ReplicaState:
    """One replica's state (see the module docstring). `apply` is called by one thread at a time (the
    replica's apply lock); reads go through a cursor per reading thread."""

    def __init__(self, path: Path, gc_threshold_days: float = 3.0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.con = duckdb.connect(str(self.path))
        # One thread: a replica applies small statements one after another, beside two other replicas
        # and etcd on the same cores; a second thread per statement only added its start-up.
        self.con.execute("SET threads = 1")
        self.con.execute(STATE_SCHEMA)
        if not self.con.sql("SELECT count(*) FROM applied").fetchall()[0][0]:
            self.con.execute("INSERT INTO applied VALUES (0, 0)")
        if not self.con.sql("SELECT count(*) FROM shard_config").fetchall()[0][0]:
            self.con.execute("INSERT INTO shard_config VALUES (0, NULL, 1)")
        self.gc_threshold_us = int(gc_threshold_days * US_PER_DAY)
        self.work = WorkClaims(self.con)
        self.caps = ClickCaps(self.con, in_transaction=True)
        self.config = self.con.sql("SELECT start_us, end_us, shards FROM shard_config ORDER BY start_us").fetchall()
        self.shards: dict[int, ShardTables] = {}
        for index in range(max(n for _, _, n in self.config)):
            self._shard(index)
        self.applied_revision, self.applied_at_us = self.con.sql("SELECT revision, at_us FROM applied").fetchall()[0]
        digest = self.con.sql("SELECT ids, hash_sum FROM id_digest ORDER BY revision DESC LIMIT 1").fetchall()
        self.digest = (int(digest[0][0]), int(digest[0][1])) if digest else (0, 0)
        self._readers = threading.local()
        self._answered: set[str] | None = None
        self._hasher = duckdb.connect()
        # The request ids applied (the table's, held in memory too: every op of every entry asks).
        self._requests = dict(self.con.sql("SELECT request_id, answer FROM applied_requests").fetchall())
        self._pruned_at_us = self.applied_at_us

    def _shard(self, index: int) -> ShardTables:
        if index not in self.shards:
            self.shards[index] = ShardTables(self.con, f"shard_{index:04d}", self.gc_threshold_us, track_changes=True)
        return self.shards[index]

    def reader(self) -> duckdb.DuckDBPyConnection:
        """This thread's cursor: reads beside the applying thread see committed entries only."""
        cursor = getattr(self._readers, "cursor", None)
        if cursor is None:
            cursor = self._readers.cursor = self.con.cursor()
        return cursor

    # Applying.
    def apply(self, revision: int, entry: Entry, answered: set[str] | None = None) -> dict[str, object]:
        """Applies the entry at `revision` in one transaction; returns each op's answer by request id
        (an op already applied is answered as it stands, not applied again). `answered`: the request
        ids whose commit statuses someone waits for (None: all); the others' are not computed."""
        if revision <= self.applied_revision:
            return {}
        answers: dict[str, object] = {}
        before = self.digest
        self.con.execute("BEGIN TRANSACTION")
        try:
            seen = self._applied_already([op.request_id for op in entry.ops])
            fresh = [op for op in entry.ops if op.request_id not in seen]
            for op in entry.ops:
                if op.request_id in seen:
                    answers[op.request_id] = self._answer_again(op, seen[op.request_id], entry.at_us)
            self._answered = answered
            for group in runs(fresh):
                answers.update(zip([op.request_id for op in group], getattr(self, f"_{group[0].kind}")(group, entry.at_us)))
            self._record(revision, entry.at_us, fresh, answers, before)
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            self.digest = before
            self._requests = dict(self.con.sql("SELECT request_id, answer FROM applied_requests").fetchall())
            for shard in self.shards.values():
                shard.reload_boundary()
            self.config = self.con.sql("SELECT start_us, end_us, shards FROM shard_config ORDER BY start_us").fetchall()
            raise
        self.applied_revision, self.applied_at_us = revision, entry.at_us
        return answers

    def _applied_already(self, request_ids: list[str]) -> dict[str, str | None]:
        return {rid: self._requests[rid] for rid in request_ids if rid in self._requests}

    def _answer_again(self, op: Op, stored: str | None, at_us: int) -> object:
        """The answer to an op whose request was applied before: a commit's statuses as they stand, a
        grant's grants (granting is idempotent per token), the stored answer for the others."""
        if op.kind == "commit":
            return self._statuses(op.table, op.args["token"])
        if op.kind == "grant":
            return self.caps.grant(op.table, op.args["token"], int(op.args["cap"]), now_us=at_us)
        return None if stored is None else json.loads(stored)

    def _record(self, revision: int, at_us: int, fresh: list[Op], answers: dict, before: tuple[int, int]) -> None:
        """The entry's request ids (with their small answers), its revision, and the id set's digest if
        it changed, in the entry's transaction; once a minute of entry time, what is past the window."""
        if fresh:
            # A commit's or a grant's answer is computed again when asked twice (_answer_again).
            stored = [None if op.kind in ("commit", "grant") else json.dumps(answers[op.request_id]) for op in fresh]
            self.con.register("fresh", pa.table({"request_id": [op.request_id for op in fresh], "answer": stored}))
            self.con.execute("INSERT INTO applied_requests SELECT request_id, $r, $t, answer FROM fresh "
                             "ON CONFLICT DO NOTHING", {"r": revision, "t": at_us})
            self.con.unregister("fresh")
            self._requests.update(zip((op.request_id for op in fresh), stored))
        self.con.execute("UPDATE applied SET revision = $r, at_us = $t", {"r": revision, "t": at_us})
        if self.digest != before:
            self.con.execute("INSERT INTO id_digest VALUES ($r, $n, $h, $t)",
                             {"r": revision, "n": self.digest[0], "h": self.digest[1], "t": at_us})
        if at_us - self._pruned_at_us >= PRUNE_EVERY_US:
            horizon = at_us - DEDUPE_WINDOW_US
            self.con.execute("DELETE FROM applied_requests WHERE at_us < $t", {"t": horizon})
            # The latest digest is kept whatever its age: it is the id set's now.
            self.con.execute("DELETE FROM id_digest WHERE at_us < $t AND revision < (SELECT max(revision) FROM id_digest)",
                             {"t": horizon})
            self._requests = dict(self.con.sql("SELECT request_id, answer FROM applied_requests").fetchall())
            self._pruned_at_us = at_us

    def _count(self, tables: list[pa.Table], sign: int) -> None:
        """The digest moved by ids added (sign 1) or removed (sign -1): tables of their MD5s' lower 64
        bits (column `hash`, from the statement that changed them), summed with wraparound."""
        for table in tables:
            if table is None or not table.num_rows:
                continue
            total = int(np.sum(table.column("hash").to_numpy(zero_copy_only=False).astype(np.uint64), dtype=np.uint64))
            ids, digest = self.digest
            self.digest = (ids + sign * table.num_rows, (digest + sign * total) & MASK)

    def _by_shard(self, group: list[Op], kind: str, at_us: int) -> list[list]:
        """Each op's table routed to the shards, applied there as `kind` requests; per op, its answers
        from each shard it touched."""
        per_op: list[list] = [[] for _ in group]
        requests: dict[int, list[tuple[int, _Request]]] = {}
        for n, op in enumerate(group):
            for shard, part in route(op.table, self.config, self._hasher).items():
                wanted = self._answered is None or op.request_id in self._answered
                requests.setdefault(shard, []).append(
                    (n, _Request(kind, events=part.select(["click_id", "timestamp_us"]), token=op.args.get("token"),
                                 now_us=at_us, answer=wanted)))
        for shard, pairs in sorted(requests.items()):
            tables = self._shard(shard)
            for (n, _), answer in zip(pairs, tables.apply([request for _, request in pairs])):
                per_op[n].append(answer)
            self._count([tables.added] if kind == "commit" else tables.removed, 1 if kind == "commit" else -1)
            tables.added, tables.removed = None, []
        return per_op

    def _commit(self, group: list[Op], at_us: int) -> list[pa.Table | None]:
        return [None if any(a is None for a in answers) else pa.concat_tables([COMMIT_SCHEMA.empty_table(), *answers])
                for answers in self._by_shard(group, "commit", at_us)]

    def _delete(self, group: list[Op], at_us: int) -> list[int]:
        return [sum(answers) for answers in self._by_shard(group, "delete", at_us)]

    def _clear(self, group: list[Op], at_us: int) -> list[int]:
        return [sum(shard.apply([_Request("clear", token=op.args["token"], now_us=at_us)])[0]
                    for shard in self.shards.values()) for op in group]

    def _gc(self, group: list[Op], at_us: int) -> list[dict]:
        answers = []
        for op in group:
            boundaries, deleted = {}, {}
            for index, shard in sorted(self.shards.items()):
                answer = shard.apply([_Request("gc", now_us=int(op.args.get("now_us") or at_us))])[0]
                self._count(shard.removed, -1)
                shard.removed = []
                boundaries[str(index)], deleted[str(index)] = answer["boundary_us"], answer["deleted"]
            answers.append({"boundaries_us": boundaries, "deleted": deleted})
        return answers

    def _reshard(self, group: list[Op], at_us: int) -> list:
        answers = []
        for op in group:
            shards, effective = int(op.args["shards"]), int(op.args["effective_at_us"])
            if effective < self.config[-1][0]:  # the proposer checked; a reshard behind another is refused here
                answers.append({"error": f"effective time {effective} us is earlier than the current "
                                         f"configuration's start {self.config[-1][0]} us"})
                continue
            for index in range(shards):
                self._shard(index)
            self.con.execute("UPDATE shard_config SET end_us = $t WHERE end_us IS NULL", {"t": effective})
            self.con.execute("INSERT INTO shard_config VALUES ($t, NULL, $n)", {"t": effective, "n": shards})
            self.config = self.con.sql("SELECT start_us, end_us, shards FROM shard_config ORDER BY start_us").fetchall()
            answers.append(self.configuration())
        return answers

    def _heartbeat(self, group: list[Op], at_us: int) -> list[dict]:
        return [self.work.heartbeat(op.args["dc"], float(op.args["ttl_seconds"]), now_us=at_us) for op in group]

    def _claim(self, group: list[Op], at_us: int) -> list[int]:
        return [self.work.claim(op.args["dc"], op.args["stream"], op.args["units"], now_us=at_us) for op in group]

    def _finish(self, group: list[Op], at_us: int) -> list[int]:
        return [self.work.finish(op.args["unit"], bool(op.args["pending"]), now_us=at_us) for op in group]

    def _grant(self, group: list[Op], at_us: int) -> list[pa.Table]:
        return [self.caps.grant(op.table, op.args["token"], int(op.args["cap"]), now_us=at_us) for op in group]

    def _import(self, group: list[Op], at_us: int) -> list[int]:
        """A single registry's ids, claims and grants, loaded once (photon/registry_cluster.py)."""
        answers = []
        for op in group:
            what = op.args["what"]
            if what == "ids":
                answers.append(self._import_ids(op.table, at_us))
            elif what == "boundaries":
                for index, boundary in op.args["boundaries"].items():
                    shard = self._shard(int(index))
                    shard.con.execute(shard.sql("UPDATE {p}gc_boundary SET boundary_us = greatest(boundary_us, $b)"),
                                      {"b": int(boundary)})
                    shard.reload_boundary()
                answers.append(len(op.args["boundaries"]))
            elif what == "shard_config":
                self.con.execute("DELETE FROM shard_config")
                self.con.executemany("INSERT INTO shard_config VALUES (?, ?, ?)", op.args["rows"])
                self.config = self.con.sql("SELECT start_us, end_us, shards FROM shard_config ORDER BY start_us").fetchall()
                for index in range(max(n for _, _, n in self.config)):
                    self._shard(index)
                answers.append(len(op.args["rows"]))
            else:  # "claims", "grants": rows of their tables as they were
                table = "claims" if what == "claims" else "grants"
                self.con.register("imported", op.table)
                self.con.execute(f"INSERT INTO {table} SELECT * FROM imported ON CONFLICT DO NOTHING")
                self.con.unregister("imported")
                answers.append(op.table.num_rows)
        return answers

    def _import_ids(self, table: pa.Table, at_us: int) -> int:
        added = 0
        for index, part in route(table, self.config, self._hasher).items():
            shard = self._shard(index)
            self.con.register("imported", part)
            inserted = self.con.sql(shard.sql(
                "INSERT INTO {p}registered_ids (click_id, timestamp_us, token, committed_at) "
                "SELECT click_id, timestamp_us, token, make_timestamp($now) FROM imported "
                "ON CONFLICT DO NOTHING RETURNING md5_number_lower(click_id) AS hash"), params={"now": at_us}).to_arrow_table()
            self.con.unregister("imported")
            self._count([inserted], 1)
            added += inserted.num_rows
        return added

    # Reading (any thread; committed entries only).
    def _statuses(self, events: pa.Table, token: str) -> pa.Table:
        looked = self.lookup(events)
        held = dict(zip(looked.column("click_id").to_pylist(), zip(looked.column("token").to_pylist(),
                                                                   looked.column("status").to_pylist())))
        ids = events.column("click_id").unique().to_pylist()
        statuses = ["too_old" if held.get(i, (None, None))[1] == "too_old" else
                    "held" if held.get(i, (None, None))[0] == token and i in held else "refused" for i in ids]
        return pa.table({"click_id": pa.array(ids, pa.string()), "status": pa.array(statuses, pa.string())})

    def lookup(self, events: pa.Table) -> pa.Table:
        reader = self.reader()
        parts = [self.shards[index].lookup(part, reader)
                 for index, part in route(events, self.config, reader).items()]
        return pa.concat_tables([LOOKUP_SCHEMA.empty_table(), *[p.cast(LOOKUP_SCHEMA) for p in parts]])

    def scan(self) -> Iterator[pa.RecordBatch]:
        reader = self.reader()
        for shard in self.shards.values():
            yield from reader.sql(shard.sql("SELECT click_id, timestamp_us, token FROM {p}registered_ids")) \
                .to_arrow_table().cast(SCAN_SCHEMA).to_batches()

    def claims(self, stream: str, files: list[str]) -> list[dict]:
        return self.work.claims(stream, files, reader=self.reader())

    def leases(self, now_us: int) -> dict[str, float | None]:
        rows = self.reader().sql("SELECT dc, expires_us, released FROM leases").fetchall()
        return {dc: None if released else round((expires - now_us) / 1e6, 3) for dc, expires, released in rows}

    def configuration(self) -> list[dict]:
        return [{"start_us": s, "end_us": e, "shards": n} for s, e, n in self.config]

    def digest_at(self, revision: int) -> dict:
        """The id set's count and digest as of `revision` (its last change at or before it)."""
        rows = self.reader().execute("SELECT revision, ids, hash_sum FROM id_digest WHERE revision <= $r "
                                     "ORDER BY revision DESC LIMIT 1", {"r": revision}).fetchall()
        changed, ids, digest = rows[0] if rows else (0, 0, 0)
        return {"revision": revision, "changed_at_revision": changed, "ids": int(ids), "digest": str(digest)}

    def counts(self) -> dict:
        reader = self.reader()
        ids = tokened = 0
        for shard in self.shards.values():
            n, t = reader.sql(shard.sql("SELECT count(*), count(token) FROM {p}registered_ids")).fetchall()[0]
            ids, tokened = ids + n, tokened + t
        return {"ids_registered": ids, "ids_with_token": tokened,
                "gc_boundaries_us": {str(i): s.boundary_us for i, s in self.shards.items()}}

    # Snapshots.
    def copy_to(self, destination: Path) -> int:
        """A consistent copy of the file (the caller holds the apply lock); returns its revision."""
        self.con.execute("CHECKPOINT")
        shutil.copyfile(self.path, destination)
        return self.applied_revision

    def close(self) -> None:
        self._hasher.close()
        self.con.close()


def runs(ops: list[Op]) -> Iterator[list[Op]]:
    """Consecutive ops of one kind: a run of commits is applied as one statement per shard (the
    earliest op wins an absent id, as in one batch of the registry of one machine)."""
    run: list[Op] = []
    for op in ops:
        if run and op.kind != run[0].kind:
            yield run
            run = []
        run.append(op)
    if run:
        yield run
