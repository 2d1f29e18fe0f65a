import json
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from resources.spark.session import SparkResource
from spark_ops.meter import metered
from spark_ops.tables import (append_once, commit_actions, delta_path, delta_rows, ensure_table, latest_version,
                             read_table, vacuum, write_output)

LEDGER_COLUMNS = ["dc", "click_id", "work_unit"]


def ledger_rows(spark, ids, unit):
    return spark.createDataFrame([("dc1", i, unit) for i in ids], "dc string, click_id string, work_unit string").select(
        "*", *[F.lit(None).cast(t).alias(c) for c, t in (
            ("query_id", "string"), ("timestamp_us", "long"), ("ad_id", "string"), ("advertiser_id", "string"),
            ("cost_micros", "long"), ("extra", "string"), ("file", "string"), ("offset", "long"), ("length", "long"))])


def columns_with_statistics(path):
    """The columns each file added to the Delta table at `path` has statistics of."""
    return [set(json.loads(json.loads(line)["add"]["stats"])["minValues"])
            for log in sorted(Path(path, "_delta_log").glob("*.json"))
            for line in log.read_text().splitlines() if '"add"' in line]


def test_a_retry_appends_nothing_an_earlier_attempt_committed(spark, tmp_path):
    path = str(tmp_path / "click_ledger")
    with metered() as meter:
        append_once(ledger_rows(spark, ["a", "b"], "u1"), "click_ledger", path, "u1", attempt=1)
        append_once(ledger_rows(spark, ["a", "b"], "u1"), "click_ledger", path, "u1", attempt=2)  # skipped
        append_once(ledger_rows(spark, ["c"], "u2"), "click_ledger", path, "u2", attempt=2)  # u2's first commit
    assert sorted(r.click_id for r in read_table(spark, "click_ledger", path).collect()) == ["a", "b", "c"]
    # What the retry's look goes by is the one column with statistics (spark_ops/tables.py, TABLE_PROPERTIES).
    stats = columns_with_statistics(path)
    assert stats and all(s == {"work_unit"} for s in stats), stats
    assert meter.commits == {"click_ledger": 2}


def test_a_created_table_carries_its_first_checksum_and_spark_appends_to_it_without_rebuilding_its_state(
        spark, tmp_path):
    first_append_jobs = {}
    for name in ("without", "with"):
        path = str(tmp_path / name / "click_ledger")
        ensure_table("click_ledger", path)
        log = Path(path, "_delta_log")
        checksum = json.loads((log / f"{0:020d}.crc").read_text())
        if name == "without":
            (log / f"{0:020d}.crc").unlink()
        with SparkResource.local(shuffle_partitions=2).jobs_counted(f"first-append-{name}") as jobs, metered():
            append_once(ledger_rows(spark, ["a"], "u1"), "click_ledger", path, "u1", attempt=1)
            first_append_jobs[name] = jobs()["spark_jobs"]
    # The checksum is the first commit's protocol and metadata, and no files.
    commit = {key: action[key] for action in commit_actions(path, 0) for key in ("protocol", "metaData") if key in action}
    assert (checksum["protocol"], checksum["metadata"]) == (commit["protocol"], commit["metaData"])
    assert (checksum["numFiles"], checksum["tableSizeBytes"]) == (0, 0)
    # Without it, Spark rebuilt the table's state with jobs of its own before and after its commit.
    assert first_append_jobs["with"] < first_append_jobs["without"], first_append_jobs
    # Spark derived the next version's checksum from it: the one file it added.
    [added] = [action["add"] for action in commit_actions(path, 1) if "add" in action]
    after = json.loads((log / f"{1:020d}.crc").read_text())
    assert (after["numFiles"], after["tableSizeBytes"]) == (1, added["size"])
    assert [r.click_id for r in read_table(spark, "click_ledger", path).collect()] == ["a"]


def test_a_retry_writes_only_the_keys_its_earlier_attempt_did_not(spark, tmp_path):
    path = str(tmp_path / "unjoinable_clicks")

    def rows(ids):
        return spark.createDataFrame([(i, "u1", "r") for i in ids], "click_id string, work_unit string, reason string")

    def unjoinable(ids):
        schema = read_table(spark, "unjoinable_clicks", path).schema
        return rows(ids).select(*[F.col(f.name) if f.name in ("click_id", "work_unit", "reason")
                                  else F.lit(None).cast(f.dataType).alias(f.name) for f in schema.fields])

    write_output(unjoinable(["a", "b"]), "unjoinable_clicks", path, "click_id", "u1", attempt=1)
    write_output(unjoinable(["a", "b", "c"]), "unjoinable_clicks", path, "click_id", "u1", attempt=2)
    assert sorted(r.click_id for r in read_table(spark, "unjoinable_clicks", path).collect()) == ["a", "b", "c"]
    # The key and the unit the retry's MERGE goes by are the columns with statistics (TABLE_PROPERTIES).
    stats = columns_with_statistics(path)
    assert stats and all(s == {"click_id", "work_unit"} for s in stats), stats


def test_vacuum_keeps_for_whole_hours_the_files_a_compaction_removed(spark, tmp_path):
    path = str(tmp_path / "click_ledger")
    for unit in ("u1", "u2"):
        append_once(ledger_rows(spark, [unit], unit), "click_ledger", path, unit, attempt=1)
    before = set((tmp_path / "click_ledger").glob("*.parquet"))
    spark.sql(f"OPTIMIZE {delta_path(path)}")
    # One hour: what the compaction removed stays, and so does the version before it.
    vacuum(spark, path, 1)
    assert before <= set((tmp_path / "click_ledger").glob("*.parquet"))
    assert delta_rows("click_ledger", path, latest_version(path) - 1).to_table().num_rows == 2
    # Fractions are refused, not rounded (RETAIN 0.25 HOURS is 0 to Delta).
    with pytest.raises(ValueError, match="whole hours"):
        vacuum(spark, path, 0.25)
    vacuum(spark, path, 0)
    assert not before & set((tmp_path / "click_ledger").glob("*.parquet"))
    assert sorted(r.click_id for r in read_table(spark, "click_ledger", path).collect()) == ["u1", "u2"]
