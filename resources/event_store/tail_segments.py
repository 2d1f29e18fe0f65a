"""The query tailer's parsed lines, kept for the query runs: a query line is parsed once, by the
tailer, and the durable tier (query_logs, log_file_map) is built from what it parsed.

After each put into the memory tier, the query tailer (photon/query_tail.py) writes what it parsed
for those ranges as one segment: a Parquet file of every line (valid and bad, in the columns a query
run stages: spark_ops/parse.py, parse_chunks, the text dropped as the query runs drop it), and beside
it a JSON file naming the ranges it covers. A query run whose ranges the segments cover stages its
lines from them (spark_ops/ingest.py: stage_queries); a range not covered, or a segment gone, and it
parses the log bytes as before. The log bytes never change once written, so a segment holds what any
parse of them gives, and segments that overlap (a tailer that started over) are read range by range,
each line from one segment only.

The tailer is the segments' one writer: it writes each file under a temporary name and renames it,
the ranges last (a reader sees a segment whole or not at all), and deletes the oldest once they
exceed `query_tail_segment_bytes` (the ranges first), and those whose lines were all cut into query
work units ten minutes before. The query dispatcher cuts query work units only
up to where the tailer has read while the tailer is fresh (sensors/dispatcher.py), so the segments
lead the runs that read them.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

RANGES_SUFFIX = ".ranges.json"
# A segment whose lines were all cut into query work units goes after this long: their runs have
# staged them by then (a run queued longer, or a retry, parses its lines itself).
CUT_SEGMENTS_KEPT_SECONDS = 600.0


@dataclass(frozen=True)
class Piece:
    """Lines of `file` in `[start, end)`, read from one segment."""

    segment: Path
    file: str
    start: int
    end: int


class TailSegments:
    """A datacenter's segments, of lines parsed with `max_line_bytes` (the one setting the parse goes
    by: a segment parsed with another, before the setting changed, is no cover)."""

    def __init__(self, directory: Path, max_line_bytes: int):
        self.directory, self.max_line_bytes = directory, max_line_bytes
        # The writer's: its segments, their sizes and ranges, oldest first.
        self._written: list[tuple[Path, int, list[tuple[str, int, int]]]] | None = None

    def write(self, ranges: list[tuple[str, int, int]], rows: pa.Table) -> Path:
        """One put's parsed lines and the ranges they are of; returns the segment's Parquet file."""
        written = self._segments_written()
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"{time.time_ns():020d}"
        segment = self.directory / f"{name}.parquet"
        pq.write_table(rows, self.directory / f".{name}.parquet.tmp")
        os.replace(self.directory / f".{name}.parquet.tmp", segment)
        (self.directory / f".{name}.tmp").write_text(
            json.dumps({"max_line_bytes": self.max_line_bytes, "ranges": [list(r) for r in ranges]}))
        os.replace(self.directory / f".{name}.tmp", self.directory / f"{name}{RANGES_SUFFIX}")
        written.append((segment, segment.stat().st_size, [tuple(r) for r in ranges]))
        return segment

    def _segments_written(self) -> list[tuple[Path, int, list[tuple[str, int, int]]]]:
        if self._written is None:  # those of an earlier writer too, listed once
            self._written = [(segment, segment.stat().st_size, ranges) for segment, ranges in self._ranges(every=True)
                             if segment.exists()]
        return self._written

    def _ranges(self, every: bool = False) -> list[tuple[Path, list[tuple[str, int, int]]]]:
        """The segments parsed with this `max_line_bytes` (`every`: all) and their ranges, oldest first."""
        if not self.directory.is_dir():
            return []
        found = []
        for path in sorted(self.directory.glob(f"*{RANGES_SUFFIX}")):
            try:
                written = json.loads(path.read_text())
            except FileNotFoundError:  # trimmed since the listing
                continue
            if every or written["max_line_bytes"] == self.max_line_bytes:
                found.append((path.with_name(path.name.removesuffix(RANGES_SUFFIX) + ".parquet"),
                              [(f, int(s), int(e)) for f, s, e in written["ranges"]]))
        return found

    def covering(self, ranges: list[tuple[str, int, int]]) -> list[Piece] | None:
        """The pieces of segments that hold every line of `ranges` once, or None if a byte of them is
        in no segment. Ranges and segments both start and end at line ends."""
        by_file: dict[str, list[tuple[int, int, Path]]] = {}
        for segment, covered in self._ranges():
            for file, start, end in covered:
                by_file.setdefault(file, []).append((start, end, segment))
        pieces = []
        for file, start, end in ranges:
            at = start
            while at < end:
                # Of the segments holding the line at `at`, the one reaching furthest.
                holding = [(e, seg) for s, e, seg in by_file.get(file, ()) if s <= at < e]
                if not holding:
                    return None
                reach, segment = max(holding)
                pieces.append(Piece(segment, file, at, min(end, reach)))
                at = min(end, reach)
        return pieces

    def stage(self, pieces: list[Piece], path: Path) -> bool:
        """The pieces' lines as Parquet at `path`, a file per segment read once (replacing what is
        there); False, and nothing at `path`, if a segment has been trimmed meanwhile."""
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        by_segment: dict[Path, list[Piece]] = {}
        for piece in pieces:
            by_segment.setdefault(piece.segment, []).append(piece)
        try:
            for i, (segment, its) in enumerate(by_segment.items()):
                rows = pq.read_table(segment)
                pq.write_table(rows.filter(_within(rows, its)), path / f"part-{i:05d}.parquet")
        except (pa.ArrowException, OSError):  # FileNotFoundError: trimmed since `covering`
            shutil.rmtree(path, ignore_errors=True)
            return False
        return True

    def trim(self, budget_bytes: int, cut: dict[str, int] | None = None) -> int:
        """Deletes the segments the query runs are done with: older than CUT_SEGMENTS_KEPT_SECONDS and
        every range of theirs cut into a query work unit (`cut`: the work unit log's next offsets);
        then the oldest, until the rest fit in `budget_bytes`. Returns how many it deleted. The
        writer's: it goes by what it wrote (listed once), not by a listing at each trim."""
        written = self._segments_written()
        old = time.time_ns() - int(CUT_SEGMENTS_KEPT_SECONDS * 1e9)
        kept = []
        for segment, size, ranges in written:
            if cut and int(segment.stem) < old and all(end <= cut.get(file, 0) for file, _, end in ranges):
                _delete(segment)
            else:
                kept.append((segment, size, ranges))
        deleted = len(written) - len(kept)
        total = sum(size for _, size, _ in kept)
        while kept and total > budget_bytes:
            segment, size, _ = kept.pop(0)
            _delete(segment)
            total, deleted = total - size, deleted + 1
        written[:] = kept
        return deleted


def _delete(segment: Path) -> None:
    segment.with_name(segment.stem + RANGES_SUFFIX).unlink(missing_ok=True)  # the ranges first: then unseen
    segment.unlink(missing_ok=True)


def _within(rows: pa.Table, pieces: list[Piece]) -> pa.ChunkedArray:  # pieces: at least one
    """Which of a segment's rows lie in one of `pieces` (of that segment): vectorized by file, a round
    per piece of a file that has several (a unit's ranges are rarely more than one per file)."""
    mask = None
    rounds: list[list[Piece]] = []
    for piece in pieces:
        free = next((r for r in rounds if all(p.file != piece.file for p in r)), None)
        if free is None:
            rounds.append(free := [])
        free.append(piece)
    for its in rounds:
        index = pc.index_in(rows["file"], value_set=pa.array([p.file for p in its], pa.string()))
        low = pc.take(pa.array([p.start for p in its], pa.int64()), index)
        high = pc.take(pa.array([p.end for p in its], pa.int64()), index)
        inside = pc.and_(pc.greater_equal(rows["offset"], low), pc.less(rows["offset"], high))
        inside = pc.fill_null(inside, False)
        mask = inside if mask is None else pc.or_(mask, inside)
    return mask
