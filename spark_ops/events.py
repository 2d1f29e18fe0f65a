"""Validation of one log line against the input contract (docs/CONTRACTS.md: input logs).

Pure Python, no Spark: the parse stage runs it inside executors, tests run it directly. A line is
either an event tuple or a `BadLine` with a one-line reason; a bad line never affects its neighbours.
"""

from __future__ import annotations

import json
import re
from typing import Annotated

import msgspec

# <server_ip>:<process_id>:<timestamp_us>
EVENT_ID = re.compile(r"^(?P<ip>[0-9A-Fa-f.:\[\]]+?):(?P<pid>\d+):(?P<ts>\d+)$")
INT64_MAX = 2**63 - 1

QUERY_REQUIRED = ("query_id", "timestamp_us", "query_text", "ads")
CLICK_REQUIRED = ("click_id", "query_id", "timestamp_us", "ad_id", "advertiser_id", "cost_micros")
AD_REQUIRED = {"ad_id": str, "advertiser_id": str, "position": int, "bid_micros": int}


class BadLine(ValueError):
    """The reason a line is quarantined."""


def _is_int(value) -> bool:
    # bool is an int subclass in Python, and JSON true is not a timestamp.
    return type(value) is int and -INT64_MAX - 1 <= value <= INT64_MAX


def _of_kind(value, kind: type) -> bool:
    # json.loads builds exact types, so `type(...) is` is isinstance here, and faster.
    return _is_int(value) if kind is int else type(value) is kind


def _require(obj: dict, name: str, kind: type):
    if name not in obj:
        raise BadLine(f"missing field {name}")
    value = obj[name]
    if not _of_kind(value, kind):
        raise BadLine(f"field {name} is not {'an integer' if kind is int else kind.__name__}")
    return value


def _event_id(value: str, name: str) -> re.Match:
    match = EVENT_ID.match(value)
    if match is None:
        raise BadLine(f"field {name} is not of the form server_ip:process_id:timestamp_us")
    return match


NESTED_TOO_DEEPLY = "JSON nested too deeply"
# msgspec's decoder is ~4x faster than Python's json and builds the same objects for what it accepts.
# It refuses some of what Python accepts (NaN, lone surrogate escapes, out-of-range floats): those
# lines take Python's path, which defines what a line means and gives the reason for a bad one.
_DECODE = msgspec.json.Decoder().decode


def _load(raw: bytes, max_line_bytes: int) -> dict:
    if len(raw) > max_line_bytes:
        raise BadLine(f"line of {len(raw)} bytes exceeds the limit of {max_line_bytes}")
    try:
        obj = _DECODE(raw)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):  # the last: bad UTF-8 in a string
        obj = _load_with_json(raw)
    if type(obj) is not dict:
        raise BadLine("JSON is not an object")
    return obj


def _load_with_json(raw: bytes):
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadLine("not UTF-8") from None
    try:
        obj = json.loads(text)
    except ValueError:
        raise BadLine("not JSON" if text.strip() else "empty line") from None
    except RecursionError:
        raise BadLine(NESTED_TOO_DEEPLY) from None
    try:
        _EXTRA_ENCODER.encode(obj).encode("utf-8")
    except UnicodeEncodeError:
        # An escape such as "\ud800" that is half of a pair: not text, and no table can store it.
        raise BadLine("a string holds a lone surrogate escape") from None
    except RecursionError:
        raise BadLine(NESTED_TOO_DEEPLY) from None
    return obj


# What json.dumps(rest, separators=(",", ":"), ensure_ascii=False) builds on each call, built once.
_EXTRA_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
# msgspec writes strings, integers, booleans and null as that encoder does, ~7x faster; floats it
# writes differently (1e16, not 1e+16), so objects holding anything else take Python's encoder.
_FAST_ENCODE = msgspec.json.Encoder().encode
_SCALARS = frozenset((str, int, bool, type(None)))


def _extra(obj: dict, required: tuple[str, ...]) -> str | None:
    """The fields beyond the required ones, as one compact JSON object (None if there are none)."""
    rest = {k: v for k, v in obj.items() if k not in required}
    if not rest:
        return None
    if all(type(v) in _SCALARS for v in rest.values()):
        return _FAST_ENCODE(rest).decode()
    try:
        return _EXTRA_ENCODER.encode(rest)
    except RecursionError:
        raise BadLine(NESTED_TOO_DEEPLY) from None


def _plain_ads(ads) -> bool:
    """Whether every entry of a list is a valid ad (the fast path's test; the checks in
    parse_query define the contract and give the reason)."""
    for ad in ads:
        if type(ad) is not dict:
            return False
        for name, kind in AD_REQUIRED.items():
            if not _of_kind(ad.get(name), kind):
                return False
    return True


def _fast_query(obj: dict) -> tuple | None:
    """parse_query's answer for a valid query, in fewer steps; None for anything else."""
    query_id, ads = obj.get("query_id"), obj.get("ads")
    match = EVENT_ID.match(query_id) if type(query_id) is str else None
    if not (match and _is_int(obj.get("timestamp_us")) and type(obj.get("query_text")) is str
            and type(ads) is list and _plain_ads(ads)):
        return None
    ads = [ad if len(ad) == len(AD_REQUIRED) else {name: ad[name] for name in AD_REQUIRED} for ad in ads]
    return (query_id, obj["timestamp_us"], obj["query_text"], ads, _extra(obj, QUERY_REQUIRED),
            match["ip"], match["pid"])


def parse_query(raw: bytes, max_line_bytes: int) -> tuple:
    """(query_id, timestamp_us, query_text, ads, extra, server_ip, process_id)"""
    obj = _load(raw, max_line_bytes)
    fast = _fast_query(obj)
    if fast is not None:
        return fast
    query_id = _require(obj, "query_id", str)
    match = _event_id(query_id, "query_id")
    timestamp_us = _require(obj, "timestamp_us", int)
    query_text = _require(obj, "query_text", str)
    ads = _require(obj, "ads", list)
    for ad in ads:
        if not isinstance(ad, dict):
            raise BadLine("an entry of ads is not an object")
        for name, kind in AD_REQUIRED.items():
            _require(ad, name, kind)
    ads = [{name: ad[name] for name in AD_REQUIRED} for ad in ads]
    return (query_id, timestamp_us, query_text, ads, _extra(obj, QUERY_REQUIRED), match["ip"], match["pid"])


def parse_click(raw: bytes, max_line_bytes: int) -> tuple:
    """(click_id, query_id, timestamp_us, ad_id, advertiser_id, cost_micros, extra)"""
    obj = _load(raw, max_line_bytes)
    click_id, query_id = obj.get("click_id"), obj.get("query_id")
    if (type(click_id) is str and type(query_id) is str and EVENT_ID.match(click_id) and EVENT_ID.match(query_id)
            and _is_int(obj.get("timestamp_us")) and type(obj.get("ad_id")) is str
            and type(obj.get("advertiser_id")) is str and _is_int(obj.get("cost_micros"))):
        return (click_id, query_id, obj["timestamp_us"], obj["ad_id"], obj["advertiser_id"], obj["cost_micros"],
                _extra(obj, CLICK_REQUIRED))
    click_id = _require(obj, "click_id", str)
    _event_id(click_id, "click_id")
    query_id = _require(obj, "query_id", str)
    _event_id(query_id, "query_id")
    return (
        click_id,
        query_id,
        _require(obj, "timestamp_us", int),
        _require(obj, "ad_id", str),
        _require(obj, "advertiser_id", str),
        _require(obj, "cost_micros", int),
        _extra(obj, CLICK_REQUIRED),
    )


# The query line fast path (query_key): msgspec checks the required fields' types in C while decoding,
# where parse_query builds every object of the line first. It accepts a subset of what parse_query
# does (an ad with fields of its own, NaN, lone surrogate escapes and anything else it refuses take
# parse_query's path), and skipped fields are checked as JSON but not decoded, so their UTF-8 is
# checked apart (tests/spark_ops/test_events.py compares the two paths on every kind of odd line).
_Int64 = Annotated[int, msgspec.Meta(ge=-INT64_MAX - 1, le=INT64_MAX)]


class _Ad(msgspec.Struct, forbid_unknown_fields=True):
    ad_id: str
    advertiser_id: str
    position: _Int64
    bid_micros: _Int64


class _QueryKey(msgspec.Struct):
    query_id: str
    timestamp_us: _Int64
    query_text: str
    ads: list[_Ad]


_DECODE_QUERY_KEY = msgspec.json.Decoder(_QueryKey).decode


def query_key(raw: bytes, max_line_bytes: int) -> tuple:
    """(query_id, timestamp_us, server_ip, process_id, line) of a query line the contract accepts
    (the line as text: the EventStore keeps it whole); BadLine otherwise, as parse_query."""
    try:
        if len(raw) <= max_line_bytes:
            text = raw.decode("utf-8")
            key = _DECODE_QUERY_KEY(raw)
            match = EVENT_ID.match(key.query_id)
            if match is not None:
                return key.query_id, key.timestamp_us, match["ip"], match["pid"], text
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        pass
    event = parse_query(raw, max_line_bytes)
    return event[0], event[1], event[5], event[6], raw.decode("utf-8")
