"""A unit's staging (spark_ops/ingest.py). A query run's (stage_queries): with a query tailer feeding
the memory tier, the lines it parsed are staged from its segments, row for row what the run's own
parse in Spark stages; ranges the tailer has not read are parsed. A click unit of one parse chunk
(stage_lines) is parsed in the driver, row for row as Spark would."""

import pyarrow.dataset as ds

from photon import gen
from photon.query_tail import QueryTailer, TailSettings
from resources.event_store.memory_tier import Holding
from resources.event_store.tail_segments import TailSegments
from resources.registry.shards import ShardedIdRegistry
from resources.settings import PipelineSettings
from resources.spark.session import SparkResource
from resources.state.layout import DataLayout
from spark_ops.ingest import line_stats, stage_lines, stage_queries
from spark_ops.handoff import materialize
from spark_ops.parse import CHUNK_BYTES, ByteRange, parse_ranges
from spark_ops.registry_calls import QueryPut
from spark_ops.schemas import PARSED

KEY = ["file", "offset"]


def staged_rows(path):
    return ds.dataset(str(path), format="parquet").to_table().sort_by([(k, "ascending") for k in KEY])


def test_a_query_run_stages_what_the_tailer_parsed_exactly_as_its_own_parse(tmp_path, spark):
    layout = DataLayout(tmp_path / "data")
    gen.generate(layout.root, gen.GenConfig(queries=600, seed=11, bad_lines=6))
    registry = ShardedIdRegistry(tmp_path / "registry", gc_interval_seconds=None)
    try:
        QueryTailer(layout, "dc1", registry, TailSettings.of(PipelineSettings())).poll()
        stream_dir = layout.stream_dir("dc1", "query")
        ranges = [ByteRange(f, 0, end) for f, end in registry.tail_state("dc1")["offsets"].items()]
        put = QueryPut(registry, "dc1", "dc1.query.0", 1, None, Holding(10**17, 3600, 1 << 30), tailed=True)
        segments = TailSegments(layout.query_tail_segments_dir("dc1"), 65536)

        from_tailer, by_tailer = stage_queries(spark, stream_dir, ranges, 65536, put, tmp_path / "tailed", segments)
        parsed, by_run = stage_queries(spark, stream_dir, ranges, 65536, put, tmp_path / "parsed")
        assert by_tailer and not by_run
        assert staged_rows(tmp_path / "tailed").equals(staged_rows(tmp_path / "parsed"))
        assert from_tailer.count() == parsed.count() == line_stats(tmp_path / "tailed").lines > 600
        assert line_stats(tmp_path / "tailed").quarantined == line_stats(tmp_path / "parsed").quarantined > 0

        # A byte past what the tailer read: the run parses its ranges itself.
        longer = [ByteRange(r.file, r.start, r.end) for r in ranges]
        with open(stream_dir / longer[0].file, "ab") as log:
            log.write(b'{"not": "a query"}\n')
        longer[0] = ByteRange(longer[0].file, 0, (stream_dir / longer[0].file).stat().st_size)
        _, by_tailer = stage_queries(spark, stream_dir, longer, 65536, put, tmp_path / "longer", segments)
        assert not by_tailer and line_stats(tmp_path / "longer").lines == line_stats(tmp_path / "parsed").lines + 1
    finally:
        registry.close()


def spark_jobs_of(stage) -> int:
    """The Spark jobs `stage()` ran, counted as a run counts its own (SparkResource.jobs_counted, on the
    process's session)."""
    with SparkResource.local(shuffle_partitions=2).jobs_counted("stage_lines-test") as jobs:
        stage()
        return jobs()["spark_jobs"]


def test_a_click_unit_of_one_chunk_is_staged_by_the_driver_row_for_row_as_by_spark(tmp_path, spark):
    layout = DataLayout(tmp_path / "data")
    gen.generate(layout.root, gen.GenConfig(queries=600, seed=11, bad_lines=6))
    stream_dir = layout.stream_dir("dc1", "click")
    ranges = [ByteRange(str(p.relative_to(stream_dir)), 0, p.stat().st_size) for p in sorted(stream_dir.rglob("*.jsonl"))]
    assert sum(r.end - r.start for r in ranges) <= CHUNK_BYTES  # one parse chunk: stage_lines parses in the driver
    staged, jobs = {}, {}
    ways = {"driver": lambda path: stage_lines(spark, "click", stream_dir, ranges, 65536, path),
            # What stage_lines does with more than a chunk: Spark's parse, materialized.
            "spark": lambda path: materialize(parse_ranges(spark, "click", stream_dir, ranges, 65536), path)}
    for way, stage_way in ways.items():
        def stage(way=way, stage_way=stage_way):
            staged[way] = stage_way(tmp_path / way)
        jobs[way] = spark_jobs_of(stage)
    # The driver's way runs no Spark job: nothing is read until the frame is used.
    assert jobs["driver"] == 0 < jobs["spark"]
    assert staged["driver"].schema == staged["spark"].schema == PARSED["click"]
    assert staged_rows(tmp_path / "driver").equals(staged_rows(tmp_path / "spark"))
    stats = line_stats(tmp_path / "driver")
    assert stats.quarantined > 0 and staged["driver"].count() == stats.lines > 50
