"""click_aggregates refreshed with joined_clicks' changes equals the aggregation of the whole of it, and
never publishes a click id joined twice."""

import pytest
from pyspark.sql import functions as F

from spark_ops.aggregates import VERSION_NOTE, ClicksJoinedTwice, aggregate_clicks, commit_note, refresh_aggregates, refreshed_through
from spark_ops.tables import TABLE_SCHEMAS, append_once, delta_path, overwrite, read_table, vacuum

MINUTE = 60_000_000
T0 = 1_763_700_000_000_000 - 1_763_700_000_000_000 % MINUTE


def joined_rows(spark, unit: str, clicks: list[tuple[str, int, str, int]]):
    """(click_id, timestamp_us, advertiser_id, cost_micros) as joined_clicks rows of `unit`."""
    schema = TABLE_SCHEMAS["joined_clicks"][0]
    rows = [
        {"click_id": c, "query_id": "q", "timestamp_us": ts, "ad_id": "ad1", "advertiser_id": adv,
         "cost_micros": cost, "work_unit": unit, "joined_by_dc": "dc1"}
        for c, ts, adv, cost in clicks
    ]
    return spark.createDataFrame(rows, schema)


def as_set(df) -> set:
    return {tuple(r) for r in df.select("advertiser_id", "minute", "clicks", "cost_micros").collect()}


def test_refreshing_with_the_changes_gives_the_whole_aggregation_and_leaves_other_keys_alone(spark, tmp_path):
    joined_path, aggregates_path = str(tmp_path / "joined_clicks"), str(tmp_path / "click_aggregates")

    def refresh():
        return refresh_aggregates(spark, joined_path, aggregates_path)

    def expected():
        return as_set(aggregate_clicks(read_table(spark, "joined_clicks", joined_path)))

    append_once(joined_rows(spark, "a", [("a1", T0 + 5, "adv1", 100), ("a2", T0 + MINUTE + 1, "adv1", 10),
                                         ("a3", T0 + 2 * MINUTE - 1, "adv2", 1)]), "joined_clicks", joined_path, "a", 1)
    assert refresh()["refreshed"] == "all"  # the first refresh
    assert as_set(read_table(spark, "click_aggregates", aggregates_path)) == expected()
    # A key no later change touches, with a value that is not joined_clicks': a refresh leaves it.
    untouched = spark.createDataFrame(
        [("adv9", 0, 7, 7)], "advertiser_id string, minute long, clicks long, cost_micros long"
    ).withColumn("minute", F.timestamp_micros(F.col("minute")))
    through, _ = refreshed_through(aggregates_path)
    with commit_note(spark, f"{VERSION_NOTE}{through}"):
        overwrite(read_table(spark, "click_aggregates", aggregates_path).unionByName(untouched), "click_aggregates",
                  aggregates_path)

    units = {
        # The second minute, shared with unit a (the last microsecond of its minute too), and a new one.
        "b": [("b1", T0 + MINUTE + 30_000_000, "adv1", 1000), ("b2", T0 + 5 * MINUTE, "adv1", 5)],
        # Late clicks of unit c land in a minute unit a also wrote.
        "c": [("c1", T0 + 7, "adv1", 20000)],
    }
    for unit, clicks in units.items():
        append_once(joined_rows(spark, unit, clicks), "joined_clicks", joined_path, unit, 1)
        done = refresh()
        assert done["refreshed"] == "changes"
        assert as_set(read_table(spark, "click_aggregates", aggregates_path)) == expected() | as_set(untouched)
        through, _ = refreshed_through(aggregates_path)
        assert through == done["joined_clicks_version"]

    # Nothing new: nothing to do. A row removed (storage loss repaired): its key is recomputed.
    assert refresh()["refreshed"] == "none"
    spark.sql(f"DELETE FROM {delta_path(joined_path)} WHERE click_id = 'b2'")
    assert refresh()["refreshed"] == "changes"
    after = as_set(read_table(spark, "click_aggregates", aggregates_path))
    assert after == expected() | as_set(untouched) and not any(r[1].timestamp() * 1e6 == T0 + 5 * MINUTE for r in after)
    minute_1 = {r for r in after if r[0] == "adv1" and r[1].timestamp() * 1e6 == T0 + MINUTE}
    assert {(r[2], r[3]) for r in minute_1} == {(2, 1010)}
    # In full, everything is recomputed: the untouched key goes.
    assert refresh_aggregates(spark, joined_path, aggregates_path, full=True)["refreshed"] == "all"
    assert as_set(read_table(spark, "click_aggregates", aggregates_path)) == expected()

    # A click id another writer appends again: neither refresh publishes it.
    through_before, _ = refreshed_through(aggregates_path)
    append_once(joined_rows(spark, "intruder", [("a1", T0 + 5, "adv1", 100)]), "joined_clicks", joined_path, "intruder", 1)
    for full in (False, True):
        with pytest.raises(ClicksJoinedTwice, match=r"holds 1 click id\(s\) joined twice"):
            refresh_aggregates(spark, joined_path, aggregates_path, full=full)
    assert refreshed_through(aggregates_path)[0] == through_before


def test_a_change_feed_whose_files_were_vacuumed_gives_a_full_refresh(spark, tmp_path):
    joined_path, aggregates_path = str(tmp_path / "joined_clicks"), str(tmp_path / "click_aggregates")
    append_once(joined_rows(spark, "a", [("a1", T0, "adv1", 1)]), "joined_clicks", joined_path, "a", 1)
    assert refresh_aggregates(spark, joined_path, aggregates_path)["refreshed"] == "all"
    for unit in ("b", "c"):
        append_once(joined_rows(spark, unit, [(f"{unit}1", T0 + MINUTE, "adv1", 10)]), "joined_clicks", joined_path, unit, 1)
    # Table maintenance compacts, and the files of the versions since the last refresh are deleted.
    spark.sql(f"OPTIMIZE {delta_path(joined_path)}")
    vacuum(spark, joined_path, 0)
    assert refresh_aggregates(spark, joined_path, aggregates_path)["refreshed"] == "all"
    assert as_set(read_table(spark, "click_aggregates", aggregates_path)) == as_set(
        aggregate_clicks(read_table(spark, "joined_clicks", joined_path)))
