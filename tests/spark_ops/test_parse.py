import json

import pyarrow as pa
import pytest

from spark_ops.parse import (
    LOOKUP_CHUNK_FIELDS,
    ByteRange,
    events,
    parse_chunks,
    parse_in_driver,
    parse_ranges,
    quarantined,
)
from spark_ops.schemas import PARSED, arrow_schema
from tests.conftest import click, query, write_lines

GOOD = [click(f"10.0.0.1:1:{i}", "10.0.0.2:2:1", i, note="x" * (i * 7)) for i in range(12)]
BAD = ["garbage{", '{"click_id": "10.0.0.1:1:1", "timestamp_us": "abc"}', "z" * 400]


@pytest.mark.parametrize("chunk_bytes", [1, 7, 64, 1 << 20])
def test_every_line_is_parsed_once_whatever_the_chunking(spark, tmp_path, chunk_bytes):
    path = write_lines(tmp_path / "w" / "0.jsonl", GOOD[:5] + BAD + GOOD[5:])
    parsed = parse_ranges(spark, "click", tmp_path, [ByteRange("w/0.jsonl", 0, path.stat().st_size)],
                          max_line_bytes=300, chunk_bytes=chunk_bytes).orderBy("offset").collect()
    assert [r.click_id for r in parsed if r.reason is None] == [c["click_id"] for c in GOOD]
    assert [r.reason for r in parsed if r.reason] == [
        "not JSON", "missing field query_id", "line of 400 bytes exceeds the limit of 300"]
    # Offsets and lengths tile the file exactly: nothing skipped, nothing read twice.
    assert parsed[0].offset == 0
    assert all(a.offset + a.length == b.offset for a, b in zip(parsed, parsed[1:]))
    assert parsed[-1].offset + parsed[-1].length == path.stat().st_size


@pytest.mark.parametrize("chunk_bytes", [7, 1 << 20])
def test_the_driver_parses_ranges_row_for_row_as_the_spark_job(spark, tmp_path, chunk_bytes):
    written = write_lines(tmp_path / "w" / "0.jsonl", GOOD[:5] + BAD + GOOD[5:]).read_bytes()
    size = write_lines(tmp_path / "w" / "1.jsonl", GOOD[3:] + BAD[:1]).stat().st_size
    # A range ending mid-file (after its first 10 lines), an empty one, one starting mid-file.
    first_ten = [i for i, byte in enumerate(written) if byte == ord("\n")][9] + 1
    ranges = [ByteRange("w/0.jsonl", 0, first_ten), ByteRange("w/1.jsonl", 0, 0),
              ByteRange("w/1.jsonl", len(json.dumps(GOOD[3])) + 1, size)]
    by_spark = parse_ranges(spark, "click", tmp_path, ranges, max_line_bytes=300, chunk_bytes=chunk_bytes).toArrow()
    by_driver = parse_in_driver("click", tmp_path, ranges, max_line_bytes=300, chunk_bytes=chunk_bytes)
    key = [("file", "ascending"), ("offset", "ascending")]
    assert by_driver.num_rows == 10 + 9
    assert by_driver.sort_by(key).equals(by_spark.cast(by_driver.schema).sort_by(key))


def test_ranges_read_only_their_bytes_and_quarantine_records_where(spark, tmp_path):
    path = write_lines(tmp_path / "w" / "0.jsonl", GOOD[:3] + BAD[:1] + GOOD[3:6])
    lines = path.read_bytes().splitlines(keepends=True)
    start = sum(len(line) for line in lines[:2])
    end = start + sum(len(line) for line in lines[2:5])
    parsed = parse_ranges(spark, "click", tmp_path, [ByteRange("w/0.jsonl", start, end)])
    assert sorted(r.click_id for r in events(parsed).collect()) == sorted(c["click_id"] for c in [GOOD[2], GOOD[3]])
    [bad] = quarantined(parsed, "dc1", "click", "u1").collect()
    assert (bad.file, bad.offset, bad.length, bad.reason) == ("w/0.jsonl", start + len(lines[2]), 9, "not JSON")
    assert (bad.dc, bad.stream, bad.work_unit, bad.snippet) == ("dc1", "click", "u1", "garbage{")


def test_a_lookup_chunk_parses_only_the_lines_that_may_hold_its_ids(tmp_path):
    ids = [f"10.0.0.1:1:{i}" for i in range(6)]
    lines = [json.dumps(query(i, 1)) for i in ids]
    lines[4] = lines[4].replace('"q ', '"a \\\\ backslash ')  # some escape: it might be any id
    path = write_lines(tmp_path / "0.jsonl", lines)
    chunk = {"path": str(path), "file": "0.jsonl", "range_end": path.stat().st_size, "chunk_start": 0,
             "chunk_end": path.stat().st_size, "owns_first_line": True, "wanted": [ids[1], ids[3]]}
    assert set(chunk) == set(LOOKUP_CHUNK_FIELDS.fieldNames())
    batch = pa.RecordBatch.from_pylist([chunk])
    out = pa.Table.from_batches(list(parse_chunks("query", 65536, arrow_schema(PARSED["query"]))([batch])))
    assert out.column("query_id").to_pylist() == [ids[1], ids[3], ids[4]]
