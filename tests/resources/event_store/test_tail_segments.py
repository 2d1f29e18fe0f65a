"""The query tailer's segments (resources/event_store/tail_segments.py): the pieces that cover a
query run's ranges hold each line once, overlapping segments included; a byte in no segment means
no cover; a segment trimmed under a reader makes its staging fail cleanly; the writer trims the
oldest first."""

import pyarrow as pa
import pyarrow.dataset as ds

from resources.event_store.tail_segments import RANGES_SUFFIX, TailSegments

LIMIT = 65536  # the parse's max_line_bytes


def lines(file: str, offsets: list[int]) -> pa.Table:
    """Rows as the parser stages them, reduced to what the segments go by (file, offset)."""
    return pa.table({"file": [file] * len(offsets), "offset": offsets, "length": [10] * len(offsets)})


def test_pieces_cover_each_line_once_across_overlapping_segments_and_a_gap_is_no_cover(tmp_path):
    segments = TailSegments(tmp_path / "segments", LIMIT)
    segments.write([("a", 0, 30)], lines("a", [0, 10, 20]))
    segments.write([("a", 30, 60), ("b", 0, 20)], pa.concat_tables([lines("a", [30, 40, 50]), lines("b", [0, 10])]))
    # A tailer that started over read the same bytes again, in other cuts.
    segments.write([("a", 0, 50)], lines("a", [0, 10, 20, 30, 40]))

    pieces = segments.covering([("a", 10, 60), ("b", 0, 20)])
    assert pieces is not None
    staged = tmp_path / "staged"
    assert segments.stage(pieces, staged)
    rows = ds.dataset(str(staged), format="parquet").to_table().sort_by([("file", "ascending"), ("offset", "ascending")])
    assert list(zip(rows["file"].to_pylist(), rows["offset"].to_pylist())) == [
        ("a", 10), ("a", 20), ("a", 30), ("a", 40), ("a", 50), ("b", 0), ("b", 10)]

    # Two ranges of one file, both from one segment: read once, each line of either range staged.
    assert segments.stage(segments.covering([("a", 0, 20), ("a", 20, 40)]), staged)
    rows = ds.dataset(str(staged), format="parquet").to_table()
    assert sorted(rows["offset"].to_pylist()) == [0, 10, 20, 30] and len(list(staged.iterdir())) == 1

    assert segments.covering([("a", 50, 70)]) is None  # bytes 60-70 were never read
    assert segments.covering([("c", 0, 10)]) is None


def test_segments_parsed_with_another_line_limit_are_no_cover(tmp_path):
    """A line between the old and the new limit is quarantined by one parse and not by the other."""
    TailSegments(tmp_path / "segments", LIMIT).write([("a", 0, 30)], lines("a", [0, 10, 20]))
    assert TailSegments(tmp_path / "segments", 2 * LIMIT).covering([("a", 0, 30)]) is None
    assert TailSegments(tmp_path / "segments", LIMIT).covering([("a", 0, 30)]) is not None


def test_a_segment_trimmed_under_a_reader_fails_its_staging_and_leaves_nothing(tmp_path):
    segments = TailSegments(tmp_path / "segments", LIMIT)
    segment = segments.write([("a", 0, 30)], lines("a", [0, 10, 20]))
    pieces = segments.covering([("a", 0, 30)])
    segment.unlink()
    staged = tmp_path / "staged"
    assert not segments.stage(pieces, staged) and not staged.exists()


def test_the_writer_trims_the_oldest_segments_beyond_its_budget(tmp_path):
    directory = tmp_path / "segments"
    earlier = TailSegments(directory, LIMIT)
    first = earlier.write([("a", 0, 30)], lines("a", [0, 10, 20]))
    size = first.stat().st_size
    # A new writer (a restarted tailer) counts the segments already there.
    segments = TailSegments(directory, LIMIT)
    second = segments.write([("a", 30, 60)], lines("a", [30, 40, 50]))
    third = segments.write([("a", 60, 90)], lines("a", [60, 70, 80]))
    assert segments.trim(3 * size + size // 2) == 0
    assert segments.trim(2 * size + size // 2) == 1
    assert not first.exists() and not first.with_name(first.stem + RANGES_SUFFIX).exists()
    assert second.exists() and third.exists()
    assert segments.covering([("a", 0, 30)]) is None and segments.covering([("a", 30, 90)]) is not None


def test_segments_whose_lines_were_all_cut_into_work_units_go_once_old(tmp_path, monkeypatch):
    segments = TailSegments(tmp_path / "segments", LIMIT)
    first = segments.write([("a", 0, 30)], lines("a", [0, 10, 20]))
    second = segments.write([("a", 30, 60), ("b", 0, 20)], pa.concat_tables([lines("a", [30, 40, 50]), lines("b", [0, 10])]))
    cut = {"a": 60, "b": 10}  # b's second line is not cut yet
    assert segments.trim(1 << 30, cut) == 0  # cut, but young: a queued run may still stage them
    monkeypatch.setattr("resources.event_store.tail_segments.CUT_SEGMENTS_KEPT_SECONDS", 0.0)
    assert segments.trim(1 << 30, cut) == 1
    assert not first.exists() and second.exists()
    assert segments.trim(1 << 30, {"a": 60, "b": 20}) == 1 and not second.exists()
