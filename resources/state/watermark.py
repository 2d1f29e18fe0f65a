"""The event-time watermark of a stream: Facebook's estimated "processing time" (§5.3).

A low watermark: an event time that few of the stream's later events fall below. Each pass (a work
unit's lines) contributes a sketch of its event times, the times at 0, 5, ..., 100 % of them. The
estimate is the `percentile` of the most recent window of passes, for the smallest window size at
which the last `windows` windows give an ascending series: a disordered stream needs larger windows
before its trend shows, an ordered one is estimated from its last pass alone. Windows grow by
doubling, up to `max_passes` passes held. The watermark never moves back.

Its accuracy is the share of a pass's events at or after the watermark that held when the pass came
(the paper's measure); its lag is the pipeline's clock minus the watermark. Events from the future
of the clock (spark_ops/validity.py) are left out of the sketches: they do not move it.

The document holding a stream's passes and watermark is resources/state/sidecars.py's
EventTimeWatermark.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SKETCH_FRACTIONS = [i / 20 for i in range(21)]  # of a pass's events: the times at 0, 5, ..., 100 %


@dataclass(frozen=True)
class WatermarkRule:
    """How a stream's watermark is estimated from its passes (`estimate`): the `percentile`, the
    `windows` that must ascend, and the passes held, at most `max_passes`."""

    percentile: float
    windows: int
    max_passes: int

    @classmethod
    def of(cls, settings) -> "WatermarkRule":
        """From the settings' watermark_* knobs (resources/settings.py, or the part of them a process was
        handed: photon/query_tail.py, TailSettings)."""
        return cls(settings.watermark_percentile, settings.watermark_windows, settings.watermark_max_passes)


def percentile_of(sketches: list[tuple[int, list[int]]], percentile: float) -> int:
    """The `percentile` of the events of several passes, each given as (events, sketch). Between two
    points of a sketch, its events are taken as spread evenly."""
    counts = np.array([n for n, _ in sketches], dtype=float)
    points = np.array([s for _, s in sketches], dtype=float)
    low, high = points[:, :-1], points[:, 1:]
    width = high - low
    mass = counts[:, None] / (len(SKETCH_FRACTIONS) - 1)
    target = percentile / 100 * counts.sum() * (1 - 1e-9)  # the sums' rounding must not cost a microsecond

    def below(v: float) -> float:
        spread = np.where(width > 0, np.clip((v - low) / np.where(width > 0, width, 1), 0, 1), v >= low)
        return float((mass * spread).sum())

    lo, hi = float(points[:, 0].min()), float(points[:, -1].max())
    while hi - lo > 1:  # event times are whole microseconds
        mid = math.floor((lo + hi) / 2)
        if below(mid) >= target:
            hi = mid
        else:
            lo = mid
    return int(hi if below(lo) < target else lo)


def merged_sketch(sketches: list[tuple[int, list[int]]]) -> list[int]:
    """One sketch for the events of several (e.g. each query writer's of one pass)."""
    return [percentile_of(sketches, f * 100) for f in SKETCH_FRACTIONS]


def estimate(passes: list[tuple[int, list[int]]], percentile: float, windows: int) -> tuple[int, int | None]:
    """The watermark the passes (oldest first) support, and the passes per window of the ascending
    series it came from (None: no window size gave one yet; then the percentile of every pass held).
    Until `windows` passes are held, the series is that of the passes there are."""
    size = 1
    while size * windows <= len(passes) or size == 1:
        count = min(windows, len(passes) // size)
        recent = passes[len(passes) - size * count:]
        values = [percentile_of(recent[i * size:(i + 1) * size], percentile) for i in range(count)]
        if all(a <= b for a, b in zip(values, values[1:])):
            return values[-1], size
        size *= 2
    return percentile_of(passes, percentile), None
