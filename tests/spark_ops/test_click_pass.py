"""A click pass and a query pass as their assets run them (spark_ops/click_pass.py,
spark_ops/query_pass.py), on real Spark, Delta, DuckDB and an embedded registry, with no Dagster run
around them: one retry trigger (spark_ops/pending.py: pending_retry) decides for the click pass, which
retries the due pending clicks with its new ones, and for the pending-click dispatcher."""

import dagster as dg
import pytest

from resources.registry.shards import ShardedIdRegistry
from resources.settings import PipelineSettings
from resources.state.layout import TABLES, DataLayout
from sensors.deps import SensorDeps
from sensors.dispatcher import pending_dispatcher
from spark_ops.click_pass import join_pass
from spark_ops.ingest import PassInputs
from spark_ops.meter import metered
from spark_ops.parse import ByteRange
from spark_ops.pending import pending_retry
from spark_ops.query_pass import ingest_pass
from tests.conftest import click, query, write_lines

SETTINGS = PipelineSettings(pending_backoff_seconds=0)
WRITER, CLICKER = "10.1.0.1:1", "10.3.0.1:1"  # the query and the click writers (ids name them)


@pytest.fixture
def pipeline(tmp_path, spark):
    """A data directory, the registry, and `run(stream, lines)`: the lines appended to the stream's
    log and run as its next work unit's pass; with `pending_only`, a pending-click retry unit's."""
    layout = DataLayout(tmp_path)
    registry = ShardedIdRegistry(layout.registry_dir, gc_interval_seconds=None)
    units = {"query": 0, "click": 0, "pending": 0}

    def run(stream: str, lines: list[dict], pending_only: bool = False):
        path = layout.stream_dir("dc1", stream) / "w" / "0.jsonl"
        start = path.stat().st_size if path.exists() else 0
        end = write_lines(path, lines).stat().st_size
        kind = "pending" if pending_only else stream
        unit, units[kind] = f"dc1.{kind}.{units[kind]:08d}", units[kind] + 1
        ranges = [] if pending_only else [ByteRange("w/0.jsonl", start, end)]
        # The pipeline's clock far ahead of every event: none is from the future.
        inputs = PassInputs("dc1", unit, 1, ranges, 10**16, layout, {name: layout.table(name) for name in TABLES},
                            layout.staging_dir(unit, 1), SETTINGS, pending_only)
        with metered() as meter:
            return (join_pass if stream == "click" else ingest_pass)(inputs, spark, registry, meter)

    yield layout, registry, run
    registry.close()


def sensor_retries(layout: DataLayout, registry) -> bool:
    """Whether the pending-click dispatcher requests a retry run now."""
    sensor = pending_dispatcher("dc1", str(layout.root), SensorDeps(SETTINGS, lambda: registry))
    with dg.instance_for_test() as instance:
        return bool(sensor(dg.build_sensor_context(instance=instance)).run_requests)


def test_the_click_pass_and_the_dispatcher_retry_pending_clicks_on_one_trigger(pipeline):
    layout, registry, run = pipeline

    def clicked(n: int, query_ts: int):
        return click(f"{CLICKER}:{n}", f"{WRITER}:{query_ts}", query_ts + 100 * n)

    _, stats, digest, _ = run("click", [clicked(1, 1000), clicked(2, 9000)])
    assert (stats.looked_up, stats.pending, digest.pending) == (2, 2, 2)

    # No query data yet: neither the dispatcher nor the next click pass retries them.
    assert not pending_retry(layout, "dc1", SETTINGS).ready and not sensor_retries(layout, registry)
    _, stats, digest, _ = run("click", [clicked(3, 3000)])
    assert (stats.looked_up, stats.pending, digest.pending) == (1, 1, 3)

    # The queries of clicks 1 and 3 arrive (click 2's never does): the dispatcher would retry them,
    # and the next click pass does, with its new click.
    run("query", [query(f"{WRITER}:1000", 1000), query(f"{WRITER}:3000", 3000)])
    assert pending_retry(layout, "dc1", SETTINGS).ready and sensor_retries(layout, registry)
    _, stats, digest, _ = run("click", [clicked(4, 1000)])
    assert (stats.looked_up, stats.joined, stats.pending, digest.pending) == (3, 3, 0, 1)
    assert not pending_retry(layout, "dc1", SETTINGS).ready and not sensor_retries(layout, registry)

    # Click 2's query arrives, and no click run comes: the retry run the dispatcher asks for joins it.
    run("query", [query(f"{WRITER}:9000", 9000)])
    assert pending_retry(layout, "dc1", SETTINGS).ready and sensor_retries(layout, registry)
    ingest, stats, digest, _ = run("click", [], pending_only=True)
    assert (ingest.lines, stats.looked_up, stats.joined, digest.pending) == (0, 1, 1, 0)
