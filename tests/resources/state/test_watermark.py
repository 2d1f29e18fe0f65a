"""The event-time watermark (resources/state/watermark.py): estimated from sketches of each pass's event
times, it ascends on a disordered stream and keeps its accuracy."""

import random

import numpy as np

from resources.state.sidecars import EventTimeWatermark
from resources.state.watermark import SKETCH_FRACTIONS, WatermarkRule, estimate, merged_sketch, percentile_of

SECOND = 1_000_000


def sketch(times: list[int]) -> list[int]:
    return [int(v) for v in np.quantile(times, SKETCH_FRACTIONS, method="inverted_cdf")]


def test_the_percentile_of_several_passes_weighs_them_by_their_events():
    evenly = list(range(0, 2001))  # 0..2000: each sketch point is a multiple of 100
    assert percentile_of([(len(evenly), sketch(evenly))], 5) == 100
    assert percentile_of([(len(evenly), sketch(evenly))], 50) == 1000
    # Three times as many events at 10,000..12,000: the 25th percentile of both is the first's end.
    later = [10_000 + t for t in range(0, 2001)] * 3
    both = [(len(evenly), sketch(evenly)), (len(later), sketch(later))]
    assert abs(percentile_of(both, 25) - 2000) <= 1
    merged = merged_sketch(both)
    assert merged[0] == 0 and merged[-1] == 12_000 and merged[10] == percentile_of(both, 50)


def test_an_ordered_stream_is_estimated_from_its_last_pass_and_a_disordered_one_from_wider_windows():
    ordered = [(100, sketch(range(t * 10, t * 10 + 10))) for t in range(8)]
    value, size = estimate(ordered, 5, 4)
    assert size == 1 and value == 70
    # Facebook's figure 7: per-pass values that ascend only over windows of four passes.
    series = [2, 3, 1, 2, 4, 1, 3, 5, 3, 4, 7, 5, 6, 4, 8, 7]
    disordered = [(1, [v * SECOND] * 21) for v in series]
    value, size = estimate(disordered, 50, 4)
    assert size == 4 and value == 6 * SECOND
    # Too few passes for any ascending series: the percentile of all of them, no window found.
    assert estimate([(1, [5] * 21), (1, [3] * 21)], 50, 4) == (3, None)


def test_a_disordered_streams_watermark_ascends_and_stays_accurate(tmp_path):
    """Passes of 2 s each: events logged up to 30 s late, and a writer whose whole shipment is 120 s
    late in some passes. The watermark must still ascend, lag the stream by less than its disorder
    allows, and have at least 95 % of each later pass at or after it (the 5th percentile)."""
    rng = random.Random(7)
    path = tmp_path / "click_watermark.json"
    marks, sizes = [], set()
    for p in range(200):
        now = (1000 + 2 * p) * SECOND
        times = [now - int(rng.expovariate(1 / 5) * SECOND) % (30 * SECOND) for _ in range(500)]
        if p % 7 == 3:
            times += [now - 120 * SECOND - rng.randrange(2 * SECOND) for _ in range(20)]
        watermark = EventTimeWatermark.load(path).watermark_us
        at_or_after = len(times) if watermark is None else sum(t >= watermark for t in times)
        mark = EventTimeWatermark.add_pass(path, f"u{p}", len(times), sketch(times), at_or_after,
                                           WatermarkRule(percentile=5, windows=4, max_passes=64))
        marks.append(mark.watermark_us)
        sizes.add(mark.window_passes)
    assert marks == sorted(marks) and marks[-1] > marks[0] + 300 * SECOND
    assert (1000 + 2 * 199) * SECOND - marks[-1] < 40 * SECOND
    assert mark.accuracy >= 0.95 and len(mark.passes) == 64
    assert max(s or 0 for s in sizes) > 1  # the late shipments needed wider windows at times
    # A retried work unit's pass replaces its earlier attempt's.
    again = EventTimeWatermark.add_pass(path, "u199", 10, [marks[-1]] * 21, 10, WatermarkRule(5, 4, 64))
    assert len(again.passes) == 64 and again.passes[-1][1] == 10
    # A pass with no event in time (all from the future) changes nothing.
    assert EventTimeWatermark.add_pass(path, "u200", 0, None, 0, WatermarkRule(5, 4, 64)).passes == again.passes
