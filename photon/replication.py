"""Replication of a log replica (`photon replicate`, `photon gen --replication-lag`).

A replica is a datacenter directory ``logs/<dc>`` (docs/CONTRACTS.md: input logs). Each
datacenter's pipeline reads its own replica, which may lag behind: hold a
shorter prefix of a file, or not have a file yet. :func:`replicate` brings a
target replica forward from a source replica the way a log shipper would:

* It only ever appends. Readers may be tailing the target's files, so target
  bytes are never truncated or rewritten; a target that is not a prefix of the
  source (longer, different bytes, or a file the source lacks) is an error
  before anything is written.
* It copies whole lines only: a source's unterminated last line (a write in
  progress) stays behind until it is complete.
* It copies up to an event-time cutoff: a file's copy stops at its first line
  whose ``timestamp_us`` is past the cutoff. Lines without an int
  ``timestamp_us`` (bad input) travel with their neighbours, so a bad line
  never blocks replication.
* Files of one directory are one writer's rotation sequence (lexical order is
  write order). Once a file stops short of the source's end, the directory's
  later files wait, so a replica holds a prefix of each writer's output; a
  duplicated click line, which repeats an earlier event time, could otherwise
  let a later file start while its predecessor is still cut.
* Each file is streamed in blocks and fsynced after its append.
"""

import json
import os
from dataclasses import dataclass
from pathlib import Path

from resources.state.layout import STREAMS

_BLOCK_BYTES = 1 << 20
# A target file must equal the source in (at least) this many of its last bytes.
_CHECK_BYTES = 64 << 10
# No event is this long; a longer line is not parsed (nor held in memory) and
# counts as a line without a timestamp.
_MAX_EVENT_BYTES = 16 << 20


@dataclass
class ReplicationStats:
    files_created: int = 0
    files_extended: int = 0
    bytes_appended: int = 0
    lines_appended: int = 0


def replicate(source: Path, target: Path, cutoff_us: int | None = None) -> ReplicationStats:
    """Append to the target replica the source's complete lines it lacks, up to
    cutoff_us (None: no cutoff). Raises ValueError if target is not a prefix."""
    source, target = Path(source), Path(target)
    if not source.is_dir():
        raise ValueError(f"source replica {source} does not exist")
    files = sorted(p.relative_to(source) for p in source.rglob("*.jsonl") if p.is_file())
    # Check everything first: an error must leave the target untouched.
    sizes = {rel: _prefix_size(source / rel, target / rel) for rel in files}
    if target.is_dir():
        known = set(files)
        for path in sorted(target.rglob("*.jsonl")):
            if path.relative_to(target) not in known:
                raise ValueError(f"{path} has no counterpart in {source}: the target is not a replica of the source")

    create_stream_dirs(target)
    stats = ReplicationStats()
    waiting_dirs: set[Path] = set()
    for rel in files:
        if rel.parent in waiting_dirs:
            continue
        start = sizes[rel] or 0
        with open(source / rel, "rb") as src:
            end, lines = _pending(src, start, cutoff_us)
            if end < os.fstat(src.fileno()).st_size:
                waiting_dirs.add(rel.parent)
            if end > start:
                _append(src, target / rel, start, end)
                if sizes[rel] is None:
                    stats.files_created += 1
                else:
                    stats.files_extended += 1
                stats.bytes_appended += end - start
                stats.lines_appended += lines
    return stats


def create_stream_dirs(replica: Path) -> None:
    """Give a replica its stream directories, so that a pipeline can start on it
    before its first file arrives."""
    for stream in STREAMS:
        (replica / stream).mkdir(parents=True, exist_ok=True)


def newest_event_us(replica: Path) -> int | None:
    """The largest timestamp_us among the replica's complete lines (reads it all)."""
    newest = None
    for path in sorted(Path(replica).rglob("*.jsonl")):
        with open(path, "rb") as f:
            for _, line in _complete_lines(f, 0):
                ts = _event_time(line)
                if ts is not None and (newest is None or ts > newest):
                    newest = ts
    return newest


def _prefix_size(source_path: Path, target_path: Path) -> int | None:
    """Size of the target file (None if absent), checked to be a prefix of the source."""
    try:
        size = target_path.stat().st_size
    except FileNotFoundError:
        return None
    source_size = source_path.stat().st_size
    if size > source_size:
        raise ValueError(f"{target_path} is longer than {source_path} ({size} > {source_size} bytes):"
                         " the target is not a replica of the source")
    overlap = min(size, _CHECK_BYTES)
    with open(source_path, "rb") as src, open(target_path, "rb") as dst:
        src.seek(size - overlap)
        dst.seek(size - overlap)
        if src.read(overlap) != dst.read(overlap):
            raise ValueError(f"{target_path} differs from {source_path} in its last {overlap} bytes:"
                             " the target is not a prefix of the source")
    return size


def _pending(src, start: int, cutoff_us: int | None) -> tuple[int, int]:
    """Offset after the last line to copy from start, and the number of lines.

    If the target ends inside a line, the first "line" is that line's rest: it
    is completed whatever its time, since the replica already holds its head.
    """
    end, lines = start, 0
    for line_end, line in _complete_lines(src, start):
        if cutoff_us is not None:
            ts = _event_time(line)
            if ts is not None and ts > cutoff_us:
                break
        end, lines = line_end, lines + 1
    return end, lines


def _complete_lines(f, start: int):
    """Yield (offset after the line, line) for each complete line from start;
    the line is None if it is longer than _MAX_EVENT_BYTES."""
    f.seek(start)
    offset = start
    head: bytearray | None = bytearray()
    while block := f.read(_BLOCK_BYTES):
        pos = 0
        while (newline := block.find(b"\n", pos)) >= 0:
            if head is not None:
                head += block[pos:newline + 1]
            yield offset + newline + 1, None if head is None or len(head) > _MAX_EVENT_BYTES else bytes(head)
            head = bytearray()
            pos = newline + 1
        if head is not None:
            head += block[pos:]
            if len(head) > _MAX_EVENT_BYTES:
                head = None
        offset += len(block)


def _event_time(line: bytes | None) -> int | None:
    """The line's int timestamp_us, or None for a line that has none."""
    if line is None:
        return None
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):  # not JSON or not UTF-8; absurdly nested
        return None
    ts = event.get("timestamp_us") if isinstance(event, dict) else None
    return ts if isinstance(ts, int) and not isinstance(ts, bool) else None


def _append(src, target_path: Path, start: int, end: int) -> None:
    """Copy source bytes [start, end) to the end of the target file (created
    if absent, then start is 0), durably."""
    target_path.parent.mkdir(parents=True, exist_ok=True)
    with open(target_path, "ab") as dst:
        # Another writer (a second replicate?) must not have moved the end.
        if os.fstat(dst.fileno()).st_size != start:
            raise ValueError(f"{target_path} changed while it was being replicated")
        src.seek(start)
        remaining = end - start
        while remaining:
            block = src.read(min(remaining, _BLOCK_BYTES))
            if not block:
                raise ValueError(f"{src.name} shrank while it was being replicated")
            dst.write(block)
            remaining -= len(block)
        dst.flush()
        os.fsync(dst.fileno())
