import json
import re

import pytest

from spark_ops.events import BadLine, parse_click, parse_query, query_key
from tests.conftest import click, query

LIMIT = 1000


def raw(obj) -> bytes:
    return json.dumps(obj).encode()


def test_valid_click_keeps_extra_fields():
    row = parse_click(raw(click("1.2.3.4:5:6", "1.2.3.4:7:1", 6, country="DE")), LIMIT)
    assert row[:6] == ("1.2.3.4:5:6", "1.2.3.4:7:1", 6, "ad1", "adv1", 100)
    assert json.loads(row[6]) == {"country": "DE"}


def test_valid_query_splits_its_id():
    row = parse_query(raw(query("10.1.2.3:4242:1763700000123456", 1763700000123456)), LIMIT)
    assert row[5:] == ("10.1.2.3", "4242")
    assert row[3] == [{"ad_id": "ad1", "advertiser_id": "adv1", "position": 1, "bid_micros": 500}]
    assert row[4] is None


@pytest.mark.parametrize(
    "line, reason",
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "JSON is not an object"),
        (b"", "empty line"),
        (b"\xff\xfe", "not UTF-8"),
        (b'{"click_id":"\xff"}', "not UTF-8"),  # inside a string, msgspec raises another error
        (raw({k: v for k, v in click("1.1.1.1:1:1", "1.1.1.1:2:1", 1).items() if k != "ad_id"}), "missing field ad_id"),
        (raw(click("1.1.1.1:1:1", "1.1.1.1:2:1", "abc")), "field timestamp_us is not an integer"),
        (raw(click("1.1.1.1:1:1", "1.1.1.1:2:1", 1, cost=1.5)), "field cost_micros is not an integer"),
        (raw(click("1.1.1.1:1:1", "1.1.1.1:2:1", True)), "field timestamp_us is not an integer"),
        (raw(click("no-colons", "1.1.1.1:2:1", 1)), "field click_id is not of the form"),
        (raw(click("1.1.1.1:1:1", "1.1.1.1:2:1", 1)) + b" " * LIMIT, "exceeds the limit"),
    ],
)
def test_bad_clicks_have_a_reason(line, reason):
    with pytest.raises(BadLine, match=reason):
        parse_click(line, LIMIT)


def test_bad_ad_entry_rejects_the_query():
    bad = query("1.1.1.1:1:1", 1)
    bad["ads"][0]["position"] = "first"
    with pytest.raises(BadLine, match="field position is not an integer"):
        parse_query(raw(bad), LIMIT)


def test_a_lone_surrogate_escape_is_bad_input_not_a_crash():
    # Python's json reads it into a str that cannot be encoded as UTF-8 (Arrow, Delta).
    line = raw(query("10.1.2.3:4242:1", 1))[:-1] + b',"s":"\\ud800 half a pair"}'
    with pytest.raises(BadLine, match="lone surrogate"):
        parse_query(line, 65536)


def test_a_deeply_nested_line_is_bad_input_not_a_crash():
    # Within the size limit, but deeper than Python's (and msgspec's) recursion allows.
    line = raw(click("1.1.1.1:1:1", "1.1.1.1:2:1", 1))[:-1] + b',"x":' + b"[" * 20000 + b"]" * 20000 + b"}"
    with pytest.raises(BadLine, match="JSON nested too deeply"):
        parse_click(line, 65536)


@pytest.mark.parametrize(
    "extra",
    [
        b'{"n":NaN,"i":-Infinity}',  # Python's json accepts them; msgspec does not
        b'{"big":123456789012345678901234567890,"neg":-18446744073709551617}',
        b'{"f":1e16,"g":1.5e-7,"h":0.1,"huge":1e400}',  # floats are written as Python writes them
        b'{"nested":{"a":[1,2.5,"\\u00fc",null,true]},"esc":"tab\\t quote\\" \\u2028 \\u001f"}',
        b'{"a":1,"a":2}',
    ],
)
def test_extra_fields_are_what_pythons_json_reads_and_writes(extra):
    base = raw(query("10.1.2.3:4242:1763700000123456", 1763700000123456))
    line = base[:-1] + b"," + extra[1:]
    expected = {k: v for k, v in json.loads(line.decode()).items() if k not in ("query_id", "timestamp_us", "query_text", "ads")}
    row = parse_query(line, 65536)
    assert row[4] == json.dumps(expected, separators=(",", ":"), ensure_ascii=False)


def _odd_query_lines() -> list[bytes]:
    """Valid and invalid query lines of every kind the fast path might judge differently."""
    good = raw(query("10.1.2.3:4242:1763700000123456", 1763700000123456))
    with_extra = [good[:-1] + b"," + extra for extra in (
        b'"n":NaN}', b'"big":123456789012345678901234567890}', b'"huge":1e400}', b'"s":"\\ud800"}',
        b'"s":"\\u00fc\\t"}', b'"a":1,"a":2}', b'"x":"\xff"}', b'"x":' + b"[" * 990 + b"]" * 990 + b"}",
        b'"x":' + b"[" * 1200 + b"]" * 1200 + b"}", b'"timestamp_us":7}', b'"query_id":"no-colons"}',
        b'"query_id":"1.1.1.1:1:5"}', b'"country":"DE","device":"tablet"}',
    )]
    odd_fields = [raw({**query("1.1.1.1:1:1", 1), **change}) for change in (
        {"timestamp_us": True}, {"timestamp_us": 1.0}, {"timestamp_us": 2**63}, {"timestamp_us": -2**63},
        {"timestamp_us": 2**63 - 1}, {"query_text": 5}, {"ads": {}}, {"ads": [5]}, {"query_id": 5},
        {"ads": [{"ad_id": "a", "advertiser_id": "b", "position": 1, "bid_micros": 2, "x": 1}]},
        {"ads": [{"ad_id": "a", "advertiser_id": "b", "position": True, "bid_micros": 2}]},
        {"ads": [{"ad_id": "a", "advertiser_id": "b", "position": 1}]}, {"ads": []},
    )]
    missing = [raw({k: v for k, v in query("1.1.1.1:1:1", 1).items() if k != name}) for name in ("ads", "query_text")]
    return [good, b" " + good + b" ", good + b" x", b"[1]", b"", b"\xff", good[:-1] + b',"s":"\x00"}',
            good + b" " * LIMIT, *with_extra, *odd_fields, *missing]


@pytest.mark.parametrize("line", _odd_query_lines())
def test_the_query_fast_path_judges_every_line_as_parse_query_does(line):
    try:
        event = parse_query(line, 65536)
        expected = (event[0], event[1], event[5], event[6], line.decode("utf-8"))
    except BadLine as bad:
        with pytest.raises(BadLine, match=re.escape(str(bad))):
            query_key(line, 65536)
    else:
        assert query_key(line, 65536) == expected
