import json

import pytest

from spark_ops.events import BadLine, parse_click, parse_query
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
