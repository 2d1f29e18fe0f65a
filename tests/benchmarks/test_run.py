"""Smoke runs of `benchmarks/run.py` on tiny workloads: the real `photon run` (a client of the
suite's Spark Connect server: these check the scripts and the correctness columns, not a mode of
Spark), DuckDB and the generator in subprocesses, results and charts written where asked."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import latency_stages, peers
from benchmarks import run as run_script
from benchmarks.run import latency_histogram, percentiles

pytestmark = pytest.mark.benchmarks

REPO = Path(__file__).resolve().parents[2]


def bench(tmp_path: Path, *args: str) -> dict:
    results = tmp_path / "results"
    subprocess.run([sys.executable, "benchmarks/run.py", "--results-dir", str(results), *args], cwd=REPO,
                   check=True, capture_output=True, text=True)
    (written,) = results.glob("*.json")
    assert written.with_suffix(".png").stat().st_size > 0
    return json.loads(written.read_text())


def test_backlog_compares_photon_with_duckdb_on_the_same_logs(tmp_path, over_spark_connect):
    """Both join exactly the generator's joinable clicks (late queries are on disk from the start);
    Photon's output has no duplicate although 1% of the click lines are; its writes are counted."""
    result = bench(tmp_path, "backlog", "--queries", "3000", "--systems", "photon,duckdb")
    photon, duckdb = result["systems"]["photon"], result["systems"]["duckdb"]
    assert result["workload"]["duplicate_click_lines"] > 0
    for system in (photon, duckdb):
        assert system["correctness"]["joined_equals_truth"]
        assert system["peak_rss_bytes"] > 0
    # Where Photon's memory went at its peak: the `photon run` process and its registry service.
    assert {"main", "registry service"} <= set(photon["peak_memory_by_process"])
    assert sum(k["pss"] for k in photon["peak_memory_by_process"].values()) == photon["peak_pss_bytes"]
    assert sum(k["rss"] for k in photon["peak_memory_by_process"].values()) <= photon["peak_rss_bytes"]
    assert photon["duplicates_in_output"] == 0
    assert photon["joined_distinct_clicks"] == result["workload"]["joinable_clicks"]
    assert all(photon["verification"].values())
    assert photon["bytes_written"]["registry"] > 0 and photon["write_amplification"] > 0
    assert set(result["targets"]) >= {"wall_over_duckdb_process", "within_10x_of_duckdb"}
    # How fast this machine's cores are, so that results of two machines compare.
    assert 0 < result["machine"]["cpu_calibration_seconds"] < 10


def test_live_measures_the_latency_of_every_joined_click(tmp_path, over_spark_connect):
    """While the generator appends, one `photon run --min-seconds` keeps tailing; then Structured
    Streaming tails a second generator run. Every joinable click becomes visible in each system's
    table once and gets a latency (commit time minus click time) that is positive."""
    result = bench(tmp_path, "live", "--rate", "5", "--duration-s", "20", "--drain-timeout-s", "300")
    assert set(result["systems"]) == {"photon", "streaming"}
    for run in result["systems"].values():
        assert run["exit_code"] == 0
        assert run["joined_visible"] == run["joinable_clicks"] > 0
        latency = run["latency_seconds"]
        assert 0 < latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"]
        assert run["latency_seconds_all_joinable"]["p99"] == latency["p99"]
        assert sum(run["latency_histogram"]["counts"]) == run["joined_visible"]
    photon, streaming = result["systems"]["photon"], result["systems"]["streaming"]
    assert len(photon["backlog_bytes"]) >= 4
    # Where each joined click's time went (benchmarks/latency_stages.py): every stage measured for
    # every joined click, none negative, the stages adding up to about the whole latency.
    stages = photon["latency_stages_seconds"]
    assert {name: stages[name]["count"] for name in stages} == {
        name: photon["joined_visible"] for name in ("in_log", "cut", "run_start", "commit", "total")}
    assert all(stages[name]["p50"] >= 0 for name in ("in_log", "cut", "run_start", "commit"))
    assert abs(stages["total"]["p50"] - photon["latency_seconds"]["p50"]) < 1.0
    # Item 5's measure is there (too few click runs alone for a line give only their count).
    assert "click_runs" in photon["upkeep_hold"]["alone"]
    # Photon ran at least as long as the generator wrote: it did not go idle between appends.
    assert photon["wall_seconds"] >= 20
    assert streaming["peer"]["correctness"]["joined_equals_truth"]
    assert streaming["peer"]["duplicates_in_one_run"] == 0


def test_percentiles_count_never_visible_clicks_as_missing():
    assert percentiles([1.0, 2.0, 3.0, 4.0]) == {"count": 4, "p50": 3.0, "p90": 4.0, "p99": 4.0, "max": 4.0}
    assert percentiles([1.0] * 8 + [float("inf")] * 2)["p90"] is None
    assert percentiles([]) == {"count": 0}


def test_the_latency_histogram_keeps_every_click_in_one_second_bins():
    histogram = latency_histogram([12.2, 12.9, 15.0, 13.5])
    assert histogram == {"bin_seconds": 1.0, "first_bin_seconds": 12, "counts": [2, 1, 0, 1]}
    assert latency_histogram([])["counts"] == []


def test_flink_missing_its_environment_is_refused_before_any_system_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(peers, "FLINK_PYTHON", tmp_path / "no-venv" / "bin" / "python")
    monkeypatch.setattr(sys, "argv", ["run.py", "--work-dir", str(tmp_path / "work"), "--results-dir",
                                      str(tmp_path / "results"), "live", "--systems", "photon,flink"])
    with pytest.raises(SystemExit) as exit_:
        run_script.main()
    assert exit_.value.code == 2
    assert "Flink's virtual environment is missing" in capsys.readouterr().err
    assert not (tmp_path / "work").exists() and not (tmp_path / "results").exists()


def test_a_click_run_beside_upkeep_is_held_by_its_seconds_above_the_line_of_those_alone():
    """Item 5's measure (benchmarks/latency_stages.py: holds): click runs alone cost 1 s + 0.1 ms a
    click; one overlapping a maintenance run took 2 s more than that, one overlapping an aggregates
    refresh 0.5 s more; a run before or after them counts as alone. The cold start counts in no line:
    the first click run (15 s, beside the first query run), and one beside the first maintenance run
    (6 s)."""
    cold = {"start": 10.0, "end": 25.0, "clicks": 1000}
    alone = [{"start": 100.0 * i, "end": 100.0 * i + 1 + 0.0001 * c, "clicks": c} for i, c in enumerate([1000, 3000, 5000, 7000], 1)]
    first_maintained = {"start": 600.0, "end": 606.0, "clicks": 5000}
    maintained = {"start": 1000.0, "end": 1000.0 + 1.5 + 2, "clicks": 5000}
    refreshed = {"start": 2000.0, "end": 2000.0 + 1.2 + 0.5, "clicks": 2000}
    beside = [("query", 12.0, 20.0), ("maintenance", 599.0, 601.0), ("maintenance", 999.0, 1001.0),
              ("aggregates", 1500.0, 1510.0), ("aggregates", 2001.0, 2010.0), ("maintenance", 3000.0, 3001.0)]
    found = latency_stages.holds([*alone, maintained, refreshed, cold, first_maintained], beside)
    assert found["alone"]["click_runs"] == 4 and abs(found["alone"]["hold_max_seconds"]) < 0.01
    assert found["maintenance"] == {"click_runs": 1, "hold_p50_seconds": 2.0, "hold_p90_seconds": 2.0, "hold_max_seconds": 2.0}
    assert found["aggregates"]["hold_p50_seconds"] == 0.5
    assert found["cold_start"] == {"click_runs": 2, "seconds_max": 15.0, "runs": [
        {"seconds": 15.0, "clicks": 1000, "beside": ["query"]}, {"seconds": 6.0, "clicks": 5000, "beside": ["maintenance"]}]}
    assert "query" not in found and set(latency_stages.hold_criterion(found)) == {"maintenance", "aggregates"}
    assert latency_stages.holds([cold, *alone[:2]], beside) == {
        "click_runs": 3, "alone": {"click_runs": 2},
        "cold_start": {"click_runs": 1, "seconds_max": 15.0, "runs": [{"seconds": 15.0, "clicks": 1000, "beside": ["query"]}]}}


def test_the_memory_sampler_counts_a_forked_family_afresh_and_only_settled_passes():
    """A child forked without an exec shares its parent's pages: both are a family, read at every pass;
    an exec'd child is not. A pass over a tree that changed while it was read is read again."""
    import os
    import time

    script = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\nelse:\n    time.sleep(60)\n"
    parent = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    execd = subprocess.Popen(["sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while len(run_script.process_tree_rss(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        family_tree = run_script.process_tree_rss(parent.pid)
        assert len(family_tree) == 2
        assert run_script.forked_families(family_tree) == set(family_tree)
        me = run_script.process_tree_rss(os.getpid())
        assert execd.pid in me and execd.pid not in run_script.forked_families(me)

        reader = run_script.PssReader(parent.pid)
        rss, pss = reader.read({**family_tree, 2**22 + 7: 1})  # listed, gone by the pass: read again
        assert rss.keys() == family_tree.keys() and all(value > 0 for value in pss.values())
    finally:
        os.killpg(parent.pid, 9)  # the forked child too
        execd.kill()
        parent.wait()
        execd.wait()


def test_the_rate_curve_runs_photon_rate_by_rate_on_replayed_logs(tmp_path, over_spark_connect):
    """Issue 73's curve, tiny: two rates of 20 s, `photon run` fed by the replayer of each rate's
    pre-generated logs. Each run joins every joinable click; its row has the latency, CPU per 1,000
    joined clicks (the feed's apart and far smaller) and memory; the system goes on to the second rate
    only if it held the first, and its max rate is the highest it held."""
    result = bench(tmp_path, "rate-curve", "--rates", "10,20", "--duration-s", "20", "--drain-timeout-s", "180",
                   "--systems", "photon")
    photon = result["systems"]["photon"]
    first = photon["points"][0]
    assert first["rate_clicks_per_second"] == 10 and first["joined_visible"] == first["joinable_clicks"] > 0
    assert first["p50_seconds"] <= first["p90_seconds"] <= first["p99_seconds"]
    assert first["cpu_seconds_per_1000_joined_clicks"] > 0 and first["peak_pss_bytes"] > 0
    assert 0 <= first["feed_cpu_seconds"] < first["cpu_seconds"] / 10
    run = photon["runs"][0]
    assert run["feed"]["kind"] == "replay" and run["feed"]["tick_late_seconds"]["max"] < 1.0
    assert "main" in run["cpu_seconds_by_process"]
    assert len(photon["points"]) == (2 if first["verdict"]["held"] else 1)
    held = [p["rate_clicks_per_second"] for p in photon["points"] if p["verdict"]["held"]]
    assert result["max_rate_p90_under_10s"]["photon"] == (max(held) if held else None)


def test_a_child_reaped_by_its_parent_keeps_its_own_kind_of_cpu(monkeypatch):
    """`photon up` reaps its Spark JVM at its stop: the JVM's seconds stay the JVM's, the total unchanged."""
    kinds = {1: "main", 2: "jvm", 3: "python"}
    monkeypatch.setattr(run_script, "process_kind", lambda pid, root: kinds[pid])
    stat = run_script.ProcStat
    cpu = run_script.TreeCpu(1)
    cpu.add({1: stat((0, 10, 0, 5.0, 0.0)), 2: stat((1, 11, 0, 100.0, 0.0)), 3: stat((1, 12, 0, 20.0, 0.0))})
    # The JVM exits and main reaps it; then the Python child exits unreaped (reparented away): carried.
    cpu.add({1: stat((0, 10, 0, 6.0, 100.0)), 3: stat((1, 12, 0, 20.0, 0.0))})
    total = cpu.add({1: stat((0, 10, 0, 6.0, 100.0))})
    assert total == 126.0
    assert cpu.by_kind == {"main": 6.0, "jvm": 100.0, "python": 20.0}


def test_drained_waits_for_a_failed_work_units_retry(tmp_path):
    """A query run failed by a killed registry left its unit's quarantine to the retry after its
    backoff: a harness that called the deployment drained then found bad lines unquarantined."""
    import dagster as dg
    from dagster._core.test_utils import create_run_for_test

    from photon.dagster_internals import instance_at
    from photon_assets.jobs import INGEST_QUERIES_JOB
    from photon_assets.work_unit import TAG_ATTEMPT, TAG_DC, TAG_STREAM, TAG_WORK_UNIT

    (tmp_path / "dagster").mkdir()
    assert run_script.drained(tmp_path, 0)
    tags = {TAG_DC: "dc1", TAG_STREAM: "query", TAG_WORK_UNIT: "dc1.query.00000003"}
    with instance_at(tmp_path / "dagster") as instance:
        create_run_for_test(instance, job_name=INGEST_QUERIES_JOB, status=dg.DagsterRunStatus.FAILURE,
                            tags={**tags, TAG_ATTEMPT: "1"})
        assert not run_script.drained(tmp_path, 0)
        create_run_for_test(instance, job_name=INGEST_QUERIES_JOB, status=dg.DagsterRunStatus.SUCCESS,
                            tags={**tags, TAG_ATTEMPT: "2"})
    assert run_script.drained(tmp_path, 0)
