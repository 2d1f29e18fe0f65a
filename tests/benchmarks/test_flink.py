"""Smoke tests of the Apache Flink peer (benchmarks/flink_join.py, run in .venv-flink by
benchmarks/peers.py) through `benchmarks/run.py` on tiny workloads, against the generator's truth
and DuckDB on the same logs; and the Structured Streaming peer's own session settings."""


import pytest

from benchmarks.flink_join import interval, statements  # the standard library only, until it runs a job
from benchmarks.peers import (CLICK_DELAY_MAX_SECONDS, event_time_span_seconds, flink_options,
                              streaming_session_conf)
from tests.benchmarks.test_run import bench  # run.py in a subprocess, its result file read back

pytestmark = pytest.mark.benchmarks



def test_flink_backlog_joins_the_same_clicks_as_photon_duckdb_and_the_truth(tmp_path, over_spark_connect):
    """Bounded sources in streaming mode, with the watermark at the backlog's span (its files are
    read in no order): every joinable click once, late queries included, as Photon and DuckDB join
    them on the same logs. Bad
    lines are skipped (not JSON, the torn line) or filtered (a missing or mistyped field) and
    counted; the over-long query line is read as a valid one, as by DuckDB and Spark."""
    result = bench(tmp_path, "backlog", "--queries", "3000", "--systems", "photon,duckdb,flink")
    workload, systems = result["workload"], result["systems"]
    flink, duckdb, photon = systems["flink"], systems["duckdb"], systems["photon"]
    # Each joined exactly the generator's joinable clicks: the same set.
    assert all(system["correctness"]["joined_equals_truth"] for system in (flink, duckdb, photon))
    assert flink["joined_distinct_clicks"] == photon["joined_distinct_clicks"] == workload["joinable_clicks"]
    assert result["targets"]["joined_distinct_clicks_equal"]
    assert flink["duplicates_in_one_run"] == 0 and workload["duplicate_click_lines"] > 0
    assert workload["late_query_events"] > 0 and flink["correctness"]["missing_late_clicks"] == 0

    clicks, queries = flink["input"]["click"], flink["input"]["query"]
    assert clicks["valid_rows"] == workload["click_lines"]  # duplicate lines are valid rows, deduplicated later
    assert clicks["torn_lines"] == 1 and clicks["skipped_unparseable"] == 2  # not JSON, and the torn line
    assert queries["valid_rows"] == workload["query_events"] + 1  # the over-long line
    dropped = (clicks["lines"] - clicks["valid_rows"]) + (queries["lines"] - queries["valid_rows"])
    assert dropped == workload["bad_lines"]  # every bad line but the over-long one, and the torn line

    settings = flink["settings"]
    assert settings["watermark_seconds"] == 3600 + CLICK_DELAY_MAX_SECONDS
    assert settings["join_window_seconds"] == CLICK_DELAY_MAX_SECONDS
    assert settings["execution.checkpointing.mode"] == "EXACTLY_ONCE"
    assert flink["checkpoints"]["completed"] >= 1 and flink["output_files"] >= 1
    assert flink["wall_to_done_seconds"] == round(flink["session_start_seconds"] + flink["wall_seconds"], 2)
    assert flink["peak_rss_bytes"] > 0 and flink["write_amplification"] > 0


def test_flink_live_commits_every_joinable_click_and_its_latency_is_measured(tmp_path):
    """`run.py live --systems flink`: the job tails shipped log files while the generator writes,
    stops once it has read and committed all of them, and every joinable click gets a latency from
    the commit (rename) time of its part file."""
    result = bench(tmp_path, "live", "--systems", "flink", "--rate", "5", "--duration-s", "20",
                   "--drain-timeout-s", "120")
    run = result["systems"]["flink"]
    assert run["exit_code"] == 0
    assert run["joined_visible"] == run["joinable_clicks"] > 0
    latency = run["latency_seconds"]
    assert 0 < latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"]
    assert sum(run["latency_histogram"]["counts"]) == run["joined_visible"]
    peer = run["peer"]
    assert peer["correctness"]["joined_equals_truth"] and peer["duplicates_in_one_run"] == 0
    assert peer["files_shipped"] >= 5 and peer["live_stop"]["stopped_after_checkpoint"] >= 1
    assert peer["settings"]["execution.checkpointing.interval"] == "1000 ms"
    assert peer["settings"]["watermark_seconds"] == CLICK_DELAY_MAX_SECONDS


def test_the_flink_job_is_an_interval_join_of_deduplicated_clicks(tmp_path):
    ddl, insert = statements(tmp_path / "logs", tmp_path / "out", 300, 300, 1.0)
    assert interval(300) == "INTERVAL '0:05:00' HOUR TO SECOND"
    assert interval(3900) == "INTERVAL '1:05:00' HOUR TO SECOND"
    assert "'json.ignore-parse-errors' = 'true'" in ddl[0] and "'source.monitor-interval' = '1000 ms'" in ddl[0]
    assert "WATERMARK FOR click_time AS click_time - INTERVAL '0:05:00'" in ddl[0]
    assert "ROW_NUMBER() OVER (PARTITION BY click_id ORDER BY proc_time)" in ddl[3]
    assert "c.click_time BETWEEN q.query_time AND q.query_time + INTERVAL '0:05:00' HOUR TO SECOND" in insert
    assert flink_options(None, 300, 5, 1, "rocksdb", "8g", 0, True)["watermark_seconds"] is None


def test_the_backlog_span_covers_the_queries_and_the_longest_click_delay():
    config = {"follow": False, "span_seconds": 3600.0, "click_delay_max_s": 300.0, "duration_s": 60.0,
              "late_delay_s": 60.0}
    assert event_time_span_seconds({"config": config}) == 3900
    assert event_time_span_seconds({"config": {**config, "follow": True}}) == 420


def test_structured_streaming_has_its_own_session_settings():
    """Not Photon's (a 2 GiB driver, 4 shuffle partitions): 8 GiB of this 24 GiB machine, a state
    store per core, RocksDB; Delta's jars from the project's cache."""
    conf = streaming_session_conf()
    assert conf["spark.driver.memory"] == "8g"
    assert conf["spark.sql.shuffle.partitions"] == "2"
    assert conf["spark.sql.streaming.stateStore.providerClass"].endswith("RocksDBStateStoreProvider")
    assert "delta-spark_2.13" in conf["spark.jars"]
    assert streaming_session_conf("4g", 4)["spark.sql.shuffle.partitions"] == "4"
