"""The replicated registry's log entries (docs/ARCHITECTURE.md, "The replicated registry").

Every change of the registry's durable state is an op: a batch of ids committed under a token
(`commit`), tokens cleared (`clear`), ids deleted by recovery (`delete`), a GC boundary moved (`gc`),
a reshard (`reshard`), a datacenter's lease taken, renewed or released (`heartbeat`), work units
claimed or finished (`claim`, `finish`), click-cap grants (`grant`), and the ids of a single registry
loaded once (`import`). An entry is what one put to etcd carries: the ops one replica batched, the
replica that proposed them, and the time it stamped on them (`at_us`), which is every time applying
them needs (GC's now, a lease's expiry, when a claim was made): a replica applying an entry never
reads its own clock, so every replica gives the same answers.

Each op carries the request id its client gave it (kept across the client's retries, and the
proposer's): a replica applies an id once, so a put whose answer was lost and that was put again, or
a client's retry through another replica, changes nothing twice (resources/registry/replica_state.py).

Encoding: msgpack (msgspec) of {"v", "by", "at", "ops"}, each op {"op", "id", "args", "ids"}, where
"ids" is an Arrow IPC stream compressed with zstd (click ids with their timestamps, tokens, ...): ids
stay Arrow data end to end. An entry stays under MAX_ENTRY_BYTES, well under etcd's request limit
(1.5 MiB by default, left as it is): the proposer splits a batch that would not fit (`split_table`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import pyarrow as pa
import pyarrow.ipc as ipc

VERSION = 1
OPS = ("commit", "delete", "clear", "gc", "reshard", "heartbeat", "claim", "finish", "grant", "import")
# An entry's encoded size at most: etcd refuses a request over 1.5 MiB (its default
# --max-request-bytes), and the JSON gateway carries a value base64-encoded.
MAX_ENTRY_BYTES = 1 << 20
# A batch of ids is split into tables of at most this many bytes in memory (zstd makes them smaller).
MAX_TABLE_BYTES = 900 << 10
_WRITE_OPTIONS = ipc.IpcWriteOptions(compression="zstd")


@dataclass
class Op:
    kind: str
    request_id: str
    args: dict = field(default_factory=dict)
    table: pa.Table | None = None

    def __post_init__(self) -> None:
        if self.kind not in OPS:
            raise ValueError(f"unknown registry op {self.kind!r} ({', '.join(OPS)})")

    @property
    def ids(self) -> int:
        return 0 if self.table is None else self.table.num_rows

    def size(self) -> int:
        """Bytes it adds to an entry at most (its table uncompressed, its arguments as JSON)."""
        return (self.table.nbytes if self.table is not None else 0) + len(msgspec.json.encode(self.args)) + 64


@dataclass
class Entry:
    proposer: str
    at_us: int
    ops: list[Op]

    def encode(self) -> bytes:
        return msgspec.msgpack.encode({
            "v": VERSION, "by": self.proposer, "at": self.at_us,
            "ops": [{"op": op.kind, "id": op.request_id, "args": op.args,
                     "ids": None if op.table is None else table_bytes(op.table)} for op in self.ops],
        })

    @classmethod
    def decode(cls, raw: bytes) -> "Entry":
        doc = msgspec.msgpack.decode(raw)
        if doc.get("v") != VERSION:
            raise ValueError(f"registry log entry of version {doc.get('v')!r}; this replica reads version {VERSION}")
        return cls(doc["by"], doc["at"], [
            Op(op["op"], op["id"], op["args"], None if op["ids"] is None else bytes_table(op["ids"]))
            for op in doc["ops"]])


def table_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema, options=_WRITE_OPTIONS) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def bytes_table(raw: bytes) -> pa.Table:
    return ipc.open_stream(pa.py_buffer(raw)).read_all()


def split_table(table: pa.Table, max_bytes: int = MAX_TABLE_BYTES) -> list[pa.Table]:
    """`table` in consecutive slices of at most `max_bytes` each (one slice when it fits)."""
    if table.num_rows == 0 or table.nbytes <= max_bytes:
        return [table]
    rows = max(1, table.num_rows * max_bytes // table.nbytes)
    return [table.slice(start, rows) for start in range(0, table.num_rows, rows)]


def pack(ops: list[Op], max_bytes: int = MAX_ENTRY_BYTES) -> list[list[Op]]:
    """The ops, in order, in groups that each fit an entry."""
    groups: list[list[Op]] = [[]]
    size = 0
    for op in ops:
        if groups[-1] and size + op.size() > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(op)
        size += op.size()
    return groups
