"""The small JSON documents ("sidecars") that runs, sensors and `photon run` share without Spark: one
file each under the data directory (resources/state/layout.py), written atomically under a lock
(several runs of one datacenter may finish at once), each stamped with a version.

The documents: the query stream's progress, the query tail and the cache bounds
(resources/event_store/progress.py), the pending digest (spark_ops/pending.py), and here each
stream's event-time watermark (EventTimeWatermark): a low watermark of the event times ingested;
pacing holds click lines ahead of the query stream's; and the removals table maintenance has yet to
vacuum (Removals).
"""
from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path

from resources.state.watermark import WatermarkRule, estimate

VERSION = 1


def read_document(path: Path) -> dict | None:
    if not path.exists():
        return None
    doc = json.loads(path.read_text())
    if doc.get("v") != VERSION:
        raise ValueError(f"{path}: state version {doc.get('v')} is not {VERSION}")
    return doc


def write_document(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        # dumps, not dump: json.dump encodes in Python (only dumps takes the C encoder), which was 11 %
        # of the query tailer's CPU for its mirror, twice a second over thousands of files' offsets.
        f.write(json.dumps({**doc, "v": VERSION}, sort_keys=True))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_document(cls, path: Path):
    """A dataclass document of this module as stored at `path`; the class's defaults if none is."""
    doc = read_document(path)
    if doc is None:
        return cls()
    doc.pop("v")
    return cls(**doc)


@contextmanager
def locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


class Document:
    """A dataclass stored as one sidecar: `load` (its defaults if there is none) and `save` (under
    the document's lock)."""

    @classmethod
    def load(cls, path: Path):
        return load_document(cls, path)

    def as_json(self) -> dict:
        """The fields as they are (JSON types, no nested dataclass): `asdict` deep-copies each one, a
        tenth of the query tailer's CPU for its mirror's offsets of thousands of files."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def save(self, path: Path) -> None:
        with locked(path):
            write_document(path, self.as_json())

@dataclass
class EventTimeWatermark(Document):
    """A stream's event-time watermark (resources/state/watermark.py) and the passes it was estimated from."""

    watermark_us: int | None = None
    window_passes: int | None = None  # passes per window of the ascending series; None: none found
    passes: list[list] = field(default_factory=list)  # [work unit, events, sketch], oldest first
    events: int = 0  # events of every pass so far
    at_or_after: int = 0  # of them, at or after the watermark when their pass came
    last_accuracy: float | None = None

    @property
    def accuracy(self) -> float | None:
        return round(self.at_or_after / self.events, 4) if self.events else None

    def lag_seconds(self, clock_us: int) -> float | None:
        return None if self.watermark_us is None else round((clock_us - self.watermark_us) / 1e6, 3)

    @classmethod
    def add_pass(cls, path: Path, work_unit: str, events: int, sketch: list[int] | None, at_or_after: int,
                 rule: WatermarkRule) -> "EventTimeWatermark":
        """Adds a pass: `events` events (none from the future), `at_or_after` of them at or after the
        watermark it read first; the estimate follows `rule`. A retried work unit's pass replaces its
        earlier attempt's in the estimate (its events count once more in the accuracy)."""
        with locked(path):
            mark = cls.load(path)
            if not events or sketch is None:
                return mark
            mark.last_accuracy = round(at_or_after / events, 4)
            mark.events += events
            mark.at_or_after += at_or_after
            mark.passes = ([p for p in mark.passes if p[0] != work_unit] + [[work_unit, events, sketch]])[-rule.max_passes:]
            value, mark.window_passes = estimate([(n, s) for _, n, s in mark.passes], rule.percentile, rule.windows)
            mark.watermark_us = value if mark.watermark_us is None else max(mark.watermark_us, value)
            write_document(path, mark.as_json())
            return mark


@dataclass
class Removals(Document):
    """When table maintenance (photon_assets/maintenance.py, its only writer) removed files from each
    table, epoch seconds, oldest first, until a VACUUM has deleted them. A VACUUM deletes only files
    removed longer ago than its retention, so one run right after a compaction deleted nothing and
    still listed the table (3 s idle, 18-52 s beside a live pipeline); it waits until one is due."""

    removed_at: dict[str, list[float]] = field(default_factory=dict)

    def add(self, table: str, at: float) -> None:
        self.removed_at.setdefault(table, []).append(at)

    def due(self, retain_hours: int, now: float) -> list[str]:
        """The tables with a removal older than `retain_hours`, which a VACUUM now would delete."""
        return sorted(t for t, times in self.removed_at.items() if times and times[0] <= now - retain_hours * 3600)

    def vacuumed(self, table: str, retain_hours: int, at: float) -> None:
        """A VACUUM begun at `at` deleted the removals older than `retain_hours` before it."""
        left = [t for t in self.removed_at.get(table, []) if t > at - retain_hours * 3600]
        if left:
            self.removed_at[table] = left
        else:
            self.removed_at.pop(table, None)
