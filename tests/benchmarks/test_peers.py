"""Smoke test of the benchmark's peer systems on a tiny workload, against the generator's truth."""

import pytest

from benchmarks.peers import run_duckdb, run_spark_batch, run_streaming, ship_completed_files
from photon.gen import GenConfig, generate

pytestmark = pytest.mark.benchmarks


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("peers-data")
    return data_dir, generate(data_dir, GenConfig(queries=2000, seed=11))


def test_duckdb_joins_exactly_the_clicks_whose_query_is_on_disk(workload, tmp_path):
    """A batch sees every file, late ones included: it joins every joinable click once, no orphan,
    no click of a bad line and not the torn one (the default bad lines change no joined click)."""
    data_dir, truth = workload
    result = run_duckdb(data_dir, tmp_path)
    assert result["correctness"]["joined_equals_truth"]
    assert result["joined_rows"] == truth["joinable_clicks"]
    assert result["distinct_clicks"] == truth["distinct_click_ids"]
    assert (tmp_path / "duckdb" / "joined_clicks.parquet").stat().st_size == result["output_bytes"]


def test_spark_batch_joins_exactly_the_clicks_whose_query_is_on_disk(workload, tmp_path, spark):
    """The same one-shot join on Spark: every joinable click once, duplicates and bad lines dropped."""
    data_dir, truth = workload
    result = run_spark_batch(data_dir, tmp_path, spark=spark)
    assert result["correctness"]["joined_equals_truth"]
    assert result["joined_rows"] == result["joined_distinct_clicks"] == truth["joinable_clicks"]
    assert result["output_bytes"] > 0


def test_streaming_joins_at_most_the_truth_once_and_again_on_replay(workload, tmp_path, spark):
    """One run writes no click twice and nothing that is not joinable (it may miss clicks whose
    query came behind the watermark). Replaying the logs with a fresh checkpoint writes clicks
    again: the checkpoint, not the output, is what makes a run exactly-once. The torn line is a
    malformed record, and the shared session's settings are restored afterwards."""
    data_dir, truth = workload
    result = run_streaming(data_dir, tmp_path, spark=spark)
    correctness = result["correctness"]
    assert result["duplicates_in_one_run"] == 0
    assert correctness["extra_clicks"] == 0
    assert 0 < result["joined_rows"] <= truth["joinable_clicks"]
    assert result["duplicates_on_replay"] > 0
    assert result["torn_line"]["read_as_malformed_record"]
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    # The workload's real bound (the generator's click delay cap), recorded with the run's settings.
    settings = result["settings"]
    assert settings["watermark"] == settings["join_window"] == "300 seconds"
    assert settings["trigger"] == "availableNow" and settings["spark.sql.shuffle.partitions"] == "2"


def test_only_complete_log_files_are_shipped_to_the_live_file_source(tmp_path):
    """A writer's newest file may still grow: it is shipped once the writer has started the next
    one, or once the generator is done; a file is linked once, with its bytes as they are then."""
    source, target, shipped = tmp_path / "logs" / "click", tmp_path / "shipped" / "click", set()
    writer = source / "10.3.0.1_7"
    writer.mkdir(parents=True)
    (writer / "00000.jsonl").write_text("a\n")
    assert ship_completed_files(source, target, shipped, all_complete=False) == 0
    (writer / "00001.jsonl").write_text("b\n")
    assert ship_completed_files(source, target, shipped, all_complete=False) == 1
    assert ship_completed_files(source, target, shipped, all_complete=False) == 0
    assert sorted(p.name for p in (target / "10.3.0.1_7").iterdir()) == ["00000.jsonl"]
    assert ship_completed_files(source, target, shipped, all_complete=True) == 1
    assert (target / "10.3.0.1_7" / "00001.jsonl").read_text() == "b\n"
    assert ship_completed_files(tmp_path / "no-such-stream", target, shipped, all_complete=True) == 0
