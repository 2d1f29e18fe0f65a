"""A replica of the replicated IdRegistry (Photon §2.1-2.2: the IdRegistry on PaxosDB, with
server-side batching): the engine `photon registry serve --replica NAME` puts behind Arrow Flight.

- **Writes are proposed, then applied.** Each change (resources/registry/log_entries.py) is queued;
  one proposer thread puts everything queued, from every client, as one entry to the etcd log
  (resources/registry/etcd_log.py) and, once a majority of etcd holds it, applies the log up to that
  entry (`sync`). The caller is answered from its own replica's application: never before its entry
  is durable and applied. While a put is in flight the next entry fills: no minimum batch and no
  wait when idle (Photon's registry servers batch the same way).
- **Every replica applies the same entries in revision order** into its own DuckDB file
  (resources/registry/replica_state.py), with the applied revision in the same transaction, stamping
  nothing from its own clock: replicas agree.
- **Reads**: a lookup waits until this replica has applied the revision its caller last saw (read
  your writes; the caller learns revisions from every answer); claims, leases, scans and digests
  read at the log's head (a quorum read of the entries after the applied revision, then applied).
  Without an etcd majority a write waits up to `proposal_seconds`, then fails retryably
  (RegistryUnavailable), and a read at the head fails likewise: no answer comes from a state that
  missed an entry.
- **The log stays small**: each replica publishes its address and applied revision under an etcd
  lease; the duty replica (the first of the published names) deletes the entries every live replica
  applied, compacts etcd's history there (`EtcdLog.trim`), defragments the members now and then, and
  proposes the GC pass every `gc_interval_seconds`.
- **A lost replica comes back by itself**: one whose applied revision is behind the trimmed one (new,
  wiped, or down while the log moved on) copies a live replica's file (taken while that replica holds
  its apply lock: a consistent state at a known revision; `snapshot`) and applies the log from there.
  Until then it is not ready and answers nothing.
- **The EventStore's memory tier** is this process's (resources/event_store/memory_tier.py), as in
  the registry of one machine: not replicated. A client keeps each datacenter's tier in one replica
  (its preferred) and asks it the three reads of a lookup in one call (`recall_with_tail`); when this
  process dies, the tier starts empty on the next with an unknown horizon.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pyarrow as pa

from resources.event_store.memory_tier import RecentQueries
from resources.registry.api import ArrowSource, IdRegistry, RegistryUnavailable, call_context
from resources.registry.click_caps import WANTED_SCHEMA
from resources.registry.held_queries import QueriesHeldHere
from resources.registry.etcd_log import EtcdLog, EtcdRefused, EtcdUnavailable
from resources.registry.log_entries import Entry, Op, pack, split_table
from resources.registry.replica_state import STATE_FILE, ReplicaState
from resources.registry.shards import COMMIT_SCHEMA, EVENTS_SCHEMA, SCAN_SCHEMA, now_us, read_arrow

log = logging.getLogger(__name__)

LEASE_SECONDS = 10  # a replica's publication outlives it by this much at most
# How often a replica with nothing to do reads the log's new entries; how often the duty replica
# defragments the members; how many answered commits a replica remembers (their revision and time).
FOLLOW_SECONDS, DEFRAGMENT_EVERY_SECONDS, ANSWERED_KEPT = 0.2, 600.0, 5000
GATHER_SECONDS = 0.04  # the most an entry waits under load for the requests of the last one's callers


class ReplicaStale(RuntimeError):
    """This replica is behind the log's trimmed revision: it must copy a live replica's state."""


@dataclass(frozen=True)
class ReplicaSettings:
    """How a replica goes: its GC threshold and cadence, how long a write waits for an etcd majority,
    the clock skew a reshard leaves room for, how often the duty replica trims the log."""

    gc_threshold_days: float = 3.0
    gc_interval_seconds: float = 60.0
    proposal_seconds: float = 20.0  # then a write fails retryably (RegistryUnavailable)
    max_clock_skew_seconds: float = 60.0
    trim_every_seconds: float = 5.0


class ReplicatedIdRegistry(QueriesHeldHere, IdRegistry):
    """One replica (see the module docstring). `snapshot_from(address, path)` copies a live replica's
    state file to `path` and returns its revision (the Flight client's, injected: this module does not
    open connections to other replicas itself). `clock` stamps the entries this replica proposes."""

    def __init__(self, name: str, directory: Path, log_: EtcdLog, address: str,
                 snapshot_from: Callable[[str, Path], int], clock: Callable[[], int] = now_us,
                 settings: ReplicaSettings = ReplicaSettings()):
        self.name, self.directory, self.log, self.address = name, Path(directory), log_, address
        self.directory.mkdir(parents=True, exist_ok=True)
        self.snapshot_from, self.clock, self.settings = snapshot_from, clock, settings
        self.gc_threshold_days, self.gc_interval_seconds = settings.gc_threshold_days, settings.gc_interval_seconds
        self.trim_every_seconds = settings.trim_every_seconds
        self.proposal_seconds = settings.proposal_seconds
        self.max_clock_skew_us = int(settings.max_clock_skew_seconds * 1e6)
        self.state = ReplicaState(self.directory / STATE_FILE, self.gc_threshold_days)
        self.apply_lock = threading.RLock()
        self.ready = threading.Event()
        self.closed = threading.Event()
        self._queue: deque[Op] = deque()
        self._queued = threading.Condition()
        self._waiting: dict[str, Future] = {}
        self._waiting_lock = threading.Lock()
        self._recent = RecentQueries()
        self._lease: int | None = None
        self._duties: dict[str, float] = {}
        self.counters_ = {"entries_applied": 0, "entries_proposed": 0, "ops_proposed": 0, "ids_proposed": 0,
                          "commit_entries_applied": 0, "commit_ops_applied": 0, "commit_ids_applied": 0,
                          "snapshots_loaded": 0}
        self.answered: deque[tuple[int, int]] = deque(maxlen=ANSWERED_KEPT)  # (revision, answered at, us)
        # Where a replica's time goes: encoding its entries, putting them, reading others', applying.
        self.seconds = {"encode": 0.0, "put": 0.0, "read": 0.0, "apply": 0.0}
        self._threads = [threading.Thread(target=target, name=f"registry-{self.name}-{what}", daemon=True)
                         for what, target in (("propose", self._propose_loop), ("follow", self._follow_loop))]

    # Life.
    def start(self) -> "ReplicatedIdRegistry":
        """Catches up (a snapshot first if the log moved past this replica's state), then serves."""
        # A GC pass and a defragmentation a whole period after the start, not at once.
        self._duties = {"gc": time.monotonic(), "defragment": time.monotonic(), "trim": time.monotonic()}
        for thread in self._threads:
            thread.start()
        return self

    def wait_ready(self, seconds: float) -> bool:
        return self.ready.wait(seconds)

    def close(self) -> None:
        self.closed.set()
        with self._queued:
            self._queued.notify_all()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=30)
        if self._lease is not None:
            with contextlib.suppress(Exception):
                self.log.etcd.request("/kv/lease/revoke", {"ID": self._lease}, deadline_seconds=2.0)
        with self.apply_lock:
            self.state.close()

    def _catch_up(self) -> None:
        """Ready once this replica's state is one the log continues (a snapshot if needed) and it
        applied the log to its head."""
        while not self.closed.is_set():
            try:
                if self.state.applied_revision < self.log.trimmed():
                    self._load_snapshot()
                self.sync()
                self.ready.set()
                log.info("replica %s ready at revision %d", self.name, self.state.applied_revision)
                return
            except ReplicaStale:
                continue
            except (EtcdUnavailable, RegistryUnavailable, OSError) as error:
                log.warning("replica %s catching up: %s; trying again", self.name, str(error).splitlines()[0])
                self.closed.wait(1.0)

    def _load_snapshot(self) -> None:
        """Copies a live replica's state (see the module docstring); tries each published one."""
        sources = {name: json.loads(value) for name, value in self.log.replicas().items() if name != self.name}
        ready = [doc["address"] for doc in sources.values() if doc.get("ready")]
        if not ready:
            raise RegistryUnavailable(f"replica {self.name} is behind the log's trimmed revision and no live "
                                      "replica is there to copy")
        partial = self.directory / f"{STATE_FILE}.partial"
        for address in ready:
            try:
                revision = self.snapshot_from(address, partial)
            except Exception as error:  # noqa: BLE001 - another source may serve
                log.warning("replica %s: no snapshot from %s: %s", self.name, address, str(error).splitlines()[0])
                continue
            with self.apply_lock:
                self.state.close()
                os.replace(partial, self.directory / STATE_FILE)
                with contextlib.suppress(FileNotFoundError):
                    (self.directory / f"{STATE_FILE}.wal").unlink()
                self.state = ReplicaState(self.directory / STATE_FILE, self.gc_threshold_days)
            self.counters_["snapshots_loaded"] += 1
            log.info("replica %s loaded a snapshot of %s at revision %d", self.name, address, revision)
            return
        raise RegistryUnavailable(f"replica {self.name}: no live replica gave a snapshot")

    def snapshot(self) -> tuple[Path, int]:
        """A consistent copy of this replica's state file, taken while applying pauses; the caller
        streams it and deletes it."""
        if not self.ready.is_set():
            raise RegistryUnavailable(f"replica {self.name} is not ready")
        copy = self.directory / f"snapshot-{uuid.uuid4().hex}.duckdb"
        with self.apply_lock:
            revision = self.state.copy_to(copy)
        return copy, revision

    # The log.
    def sync(self, until: int | None = None, own: Entry | None = None) -> None:
        """Applies the log's entries after the applied revision: up to `until`, or all there are (the
        log's head as of a linearizable read). `own`: the entry this replica put at `until`, applied
        from memory once the entries before it are (its value is not read back from etcd)."""
        with self.apply_lock:
            while until is None or self.state.applied_revision < until:
                started = time.perf_counter()
                entries, trimmed, _ = self.log.read_after(self.state.applied_revision,
                                                          before=until if own is not None else None)
                self.seconds["read"] += time.perf_counter() - started
                if trimmed > self.state.applied_revision:
                    self.ready.clear()
                    raise ReplicaStale(f"replica {self.name} applied revision {self.state.applied_revision}, "
                                       f"the log is trimmed to {trimmed}")
                for revision, raw in entries:
                    self._apply(revision, Entry.decode(raw))
                if len(entries) < 16:
                    if own is not None and self.state.applied_revision < until:
                        self._apply(until, own)
                    return

    def _apply(self, revision: int, entry: Entry) -> None:
        started = time.perf_counter()
        with self._waiting_lock:
            waited = {op.request_id for op in entry.ops if op.request_id in self._waiting}
        answers = self.state.apply(revision, entry, waited)
        self.seconds["apply"] += time.perf_counter() - started
        self.counters_["entries_applied"] += 1
        commits = [op for op in entry.ops if op.kind == "commit"]
        if commits:
            self.counters_["commit_entries_applied"] += 1
            self.counters_["commit_ops_applied"] += len(commits)
            self.counters_["commit_ids_applied"] += sum(op.ids for op in commits)
        with self._waiting_lock:
            waiting = [(self._waiting.pop(rid), answer) for rid, answer in answers.items() if rid in self._waiting]
        for future, answer in waiting:
            future.set_result((answer, revision))

    def _propose_loop(self) -> None:
        self._catch_up()
        last_ops, last_seconds = 1, 0.0
        while not self.closed.is_set():
            with self._queued:
                while not self._queue and not self.closed.is_set():
                    self._queued.wait()
                self._gather(last_ops, last_seconds)
                ops = list(self._queue)
                self._queue.clear()
            started = time.monotonic()
            for group in pack(ops):
                self._propose(group)
            last_ops, last_seconds = len(ops), time.monotonic() - started

    def _gather(self, last_ops: int, last_seconds: float) -> None:
        """Under load (the last entry carried several requests), waits a moment for as many again: the
        callers answered by the last entry send their next request within milliseconds, and without the
        wait they would make an entry of their own beside the one now queued (two cohorts alternating,
        each paying an entry's fixed cost; an ON CONFLICT insert costs ~20 ms however few its ids).
        Alone (the last entry one request), nothing waits: no latency added when idle. Called holding
        `_queued`."""
        if last_ops < 2:
            return
        deadline = time.monotonic() + min(GATHER_SECONDS, last_seconds / 4)
        wanted = len(self._queue) + last_ops  # those queued meanwhile, and the last entry's callers again
        while len(self._queue) < wanted and not self.closed.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._queued.wait(left)

    def _propose(self, group: list[Op]) -> None:
        """Puts one entry, then applies the log up to it (its own value from memory), which answers its
        ops. One entry at a time: what arrives meanwhile is the next entry (measured: putting the next
        while the last applies made entries of one request each, applied one by one behind the puts,
        and halved the throughput of small commits)."""
        entry = Entry(self.name, self.clock(), group)
        try:
            started = time.perf_counter()
            raw = entry.encode()
            encoded = time.perf_counter()
            revision = self.log.append(self.name, raw, self.proposal_seconds)
            self.seconds["encode"] += encoded - started
            self.seconds["put"] += time.perf_counter() - encoded
            self.counters_["entries_proposed"] += 1
            self.counters_["ops_proposed"] += len(group)
            self.counters_["ids_proposed"] += sum(op.ids for op in group)
            self.sync(until=revision, own=entry)
        except (EtcdUnavailable, ReplicaStale, EtcdRefused) as error:
            # The entry may still be committed and applied later: its ops' request ids make that, and
            # the clients' retries under the same ids, harmless.
            self._fail([op.request_id for op in group], RegistryUnavailable(
                f"registry replica {self.name}: {str(error).splitlines()[0]}"))
        except Exception as error:  # noqa: BLE001 - answered to its callers; the loop goes on
            log.exception("replica %s: an entry failed to apply", self.name)
            self._fail([op.request_id for op in group], error)

    def _fail(self, request_ids: list[str], error: Exception) -> None:
        with self._waiting_lock:
            futures = [self._waiting.pop(rid) for rid in request_ids if rid in self._waiting]
        for future in futures:
            if not future.done():
                future.set_exception(error)

    def _submit(self, ops: list[Op]) -> list:
        """Queues the ops for the next entry; their answers once applied (RegistryUnavailable when
        the entry could not be made durable in time)."""
        self._serving()
        futures = []
        with self._waiting_lock:
            for op in ops:
                futures.append(self._waiting.setdefault(op.request_id, Future()))
        with self._queued:
            self._queue.extend(ops)
            self._queued.notify()
        answers, revision = [], 0
        for future in futures:
            try:
                answer, applied = future.result(timeout=self.proposal_seconds + 10)
            except TimeoutError:
                raise RegistryUnavailable(f"registry replica {self.name}: no answer within "
                                          f"{self.proposal_seconds + 10:.0f} s") from None
            answers.append(answer)
            revision = max(revision, applied)
        call_context().revision = revision
        return answers

    def _one(self, kind: str, args: dict, table: pa.Table | None = None) -> object:
        return self._submit([Op(kind, call_context().request_id or uuid.uuid4().hex, args, table)])[0]

    def _serving(self) -> None:
        if not self.ready.is_set():
            raise RegistryUnavailable(f"registry replica {self.name} is catching up")

    def _at_least(self, revision: int) -> None:
        """Applied at least `revision` (a caller's last seen), reading the log if not yet."""
        self._serving()
        if self.state.applied_revision < revision:
            self._read_log()
        call_context().revision = self.state.applied_revision

    def _at_head(self) -> None:
        self._serving()
        self._read_log()
        call_context().revision = self.state.applied_revision

    def _read_log(self) -> None:
        try:
            self.sync()
        except (EtcdUnavailable, ReplicaStale) as error:
            raise RegistryUnavailable(f"registry replica {self.name}: {str(error).splitlines()[0]}") from None

    # Duties of a live replica: following the log, publishing, trimming, GC.
    def _follow_loop(self) -> None:
        self.ready.wait()
        while not self.closed.wait(FOLLOW_SECONDS):
            try:
                if not self.ready.is_set():
                    self._catch_up()
                self.sync()
                self._duty("publish", 1.0, self._publish)
                if self._on_duty():
                    self._duty("trim", self.trim_every_seconds, self._trim)
                    self._duty("gc", self.gc_interval_seconds, lambda: self._one("gc", {}))
                    self._duty("defragment", DEFRAGMENT_EVERY_SECONDS, self.log.etcd.defragment)
            except ReplicaStale as error:
                log.warning("%s: copying a live replica", error)
            except (EtcdUnavailable, RegistryUnavailable) as error:
                log.warning("replica %s: %s", self.name, str(error).splitlines()[0])
            except Exception:  # noqa: BLE001 - the loop outlives any one failure
                log.exception("replica %s: following the log failed", self.name)

    def _duty(self, what: str, every: float, action: Callable[[], object]) -> None:
        now = time.monotonic()
        if now - self._duties.get(what, -every) >= every:
            self._duties[what] = now
            action()

    def _publish(self) -> None:
        if self._lease is None or not self.log.etcd.keep_alive(self._lease):
            self._lease = self.log.etcd.grant_lease(LEASE_SECONDS)
        doc = {"address": self.address, "applied": self.state.applied_revision, "ready": self.ready.is_set()}
        self.log.publish(self.name, json.dumps(doc).encode(), self._lease)

    def published(self) -> dict[str, dict]:
        return {name: json.loads(value) for name, value in self.log.replicas().items()}

    def _on_duty(self) -> bool:
        live = sorted(name for name, doc in self.published().items() if doc.get("ready"))
        return bool(live) and live[0] == self.name

    def _trim(self) -> None:
        applied = [doc["applied"] for doc in self.published().values()]
        boundary = min(applied + [self.state.applied_revision])
        if boundary > self.log.trimmed():
            deleted = self.log.trim(boundary)
            log.debug("replica %s trimmed the log to revision %d (%d entries)", self.name, boundary, deleted)

    # The IdRegistry: writes.
    def commit(self, events: ArrowSource, token: str) -> pa.Table:
        if not token:
            raise ValueError("commit needs a non-empty token")
        table = read_arrow(events, EVENTS_SCHEMA)
        request = call_context().request_id or uuid.uuid4().hex
        parts = split_table(table)
        ops = [Op("commit", request if len(parts) == 1 else f"{request}/{n}", {"token": token}, part)
               for n, part in enumerate(parts)]
        answers = self._submit(ops)
        self.answered.append((call_context().revision or 0, now_us()))
        return pa.concat_tables([COMMIT_SCHEMA.empty_table(), *answers])

    def delete(self, events: ArrowSource) -> int:
        return int(self._one("delete", {}, read_arrow(events, EVENTS_SCHEMA)))

    def clear_tokens(self, token: str) -> int:
        return int(self._one("clear", {"token": token}))

    def collect_garbage(self) -> dict:
        return self._one("gc", {})

    def reshard(self, shards: int, effective_at_us: int | None = None) -> list[dict]:
        if shards < 1:
            raise ValueError(f"shards must be at least 1, got {shards}")
        earliest = self.clock() + self.max_clock_skew_us
        effective = earliest if effective_at_us is None else effective_at_us
        if effective < earliest:
            raise ValueError(f"effective time {effective} us is earlier than now + max clock skew ({earliest} us)")
        answer = self._one("reshard", {"shards": shards, "effective_at_us": effective})
        if isinstance(answer, dict) and "error" in answer:
            raise ValueError(answer["error"])
        return answer

    def heartbeat(self, dc: str | None, ttl_seconds: float) -> dict[str, float | None]:
        if dc:
            return self._one("heartbeat", {"dc": dc, "ttl_seconds": ttl_seconds})
        self._at_head()
        return self.state.leases(self.clock())

    def claim_work(self, dc: str, stream: str, units: list[dict]) -> int:
        return int(self._one("claim", {"dc": dc, "stream": stream, "units": units}))

    def finish_work(self, unit: str, pending: bool) -> int:
        return int(self._one("finish", {"unit": unit, "pending": pending}))

    def grant_clicks(self, wanted: ArrowSource, token: str, cap: int) -> pa.Table:
        if not token:
            raise ValueError("a grant needs a non-empty token")
        if cap < 1:
            raise ValueError(f"the click cap must be at least 1, got {cap}")
        return self._one("grant", {"token": token, "cap": cap}, read_arrow(wanted, WANTED_SCHEMA))

    def import_single(self, what: str, args: dict, table: pa.Table | None = None) -> object:
        """Loads part of a single registry's state once (photon/registry_cluster.py)."""
        return self._one("import", {"what": what, **args}, table)

    # Reads.
    def lookup(self, events: ArrowSource) -> pa.Table:
        self._at_least(call_context().min_revision)
        return self.state.lookup(read_arrow(events, EVENTS_SCHEMA))

    def scan(self) -> pa.RecordBatchReader:
        self._at_head()
        return pa.RecordBatchReader.from_batches(SCAN_SCHEMA, list(self.state.scan()))

    def work_claims(self, stream: str, files: list[str]) -> list[dict]:
        self._at_head()
        return self.state.claims(stream, files)

    def digest(self, revision: int) -> dict:
        """The id set's digest as of `revision` (resources/registry/replica_state.py: digest_at)."""
        self._at_least(revision)
        return {"replica": self.name, **self.state.digest_at(revision)}

    def health(self) -> dict:
        return {"replica": self.name, "ready": self.ready.is_set(), "applied": self.state.applied_revision}

    def counters(self) -> dict:
        c = self.counters_
        # A "transaction" is a log entry that carried commits: server-side batching is its ids and commits.
        total = {"transactions": c["commit_entries_applied"], "ids_in_transactions": c["commit_ids_applied"],
                 "requests_received": c["ops_proposed"], "requests_in_transactions": c["commit_ops_applied"]}
        total["ids_per_transaction_mean"] = total["ids_in_transactions"] / total["transactions"] if total["transactions"] else 0.0
        return {"total": total, "replica": {"name": self.name, "applied_revision": self.state.applied_revision,
                                            "ready": self.ready.is_set(), **c,
                                            "seconds": {k: round(v, 3) for k, v in self.seconds.items()}},
                "configuration": self.state.configuration(), "gc_threshold_days": self.gc_threshold_days,
                "recent_queries": self._recent.stats()}

    def stats(self) -> dict:
        counts = self.state.counts()
        stats = self.counters()
        stats["total"].update(ids_registered=counts["ids_registered"], ids_with_token=counts["ids_with_token"])
        stats["replica"]["gc_boundaries_us"] = counts["gc_boundaries_us"]
        stats["replica"]["answered_commits"] = [{"revision": r, "answered_at_us": t} for r, t in self.answered]
        return stats
