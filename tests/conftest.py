"""Shared fixtures. One Spark session serves the whole suite (a JVM start costs ~8 s on 2 cores)."""

import json
from pathlib import Path

import pytest

from resources.spark import delta_session

# The quick tier (`scripts/test.sh --quick`, a few minutes): pure functions, sensors through
# build_sensor_context, the registry against real DuckDB, the generator, and one small
# end-to-end run of `photon run`. Everything else runs in the full suite.
QUICK = (
    "tests/sensors/",
    "tests/resources/test_registry.py",
    "tests/resources/test_registry_shards.py",
    "tests/resources/test_work_claims.py",
    "tests/resources/test_watermark.py",
    "tests/resources/test_recent_queries.py",
    "tests/resources/test_work_unit_log.py",
    "tests/resources/test_ownership.py",
    "tests/photon/",
    "tests/spark_ops/test_events.py",
    "tests/spark_ops/test_tables.py",
    "tests/test_definitions.py",
    "tests/test_connect_compatible.py",
    "tests/e2e/test_photon_run.py::test_a_small_workload_end_to_end",
    "tests/e2e/test_photon_run.py::test_bad_invocations_fail_with_one_line",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(QUICK):
            item.add_marker(pytest.mark.quick)


@pytest.fixture(scope="session")
def spark():
    return delta_session(shuffle_partitions=2, driver_memory="2g")


def click(click_id: str, query_id: str, ts: int, advertiser: str = "adv1", cost: int = 100, **extra) -> dict:
    return {"click_id": click_id, "query_id": query_id, "timestamp_us": ts, "ad_id": "ad1",
            "advertiser_id": advertiser, "cost_micros": cost, **extra}


def query(query_id: str, ts: int, **extra) -> dict:
    ads = [{"ad_id": "ad1", "advertiser_id": "adv1", "position": 1, "bid_micros": 500}]
    return {"query_id": query_id, "timestamp_us": ts, "query_text": f"q {query_id}", "ads": ads, **extra}


def write_lines(path: Path, lines: list, torn: str = "") -> Path:
    """Writes events (dicts) or raw strings as JSON lines, optionally followed by a torn line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join((json.dumps(line) if isinstance(line, dict) else line) + "\n" for line in lines)
    with open(path, "a", encoding="utf-8") as f:
        f.write(text + torn)
    return path
