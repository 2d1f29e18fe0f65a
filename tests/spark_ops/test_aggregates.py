"""click_aggregates refreshed per work unit equals the aggregation of the whole of joined_clicks."""

from pyspark.sql import functions as F

from spark_ops.aggregates import aggregate_clicks, refresh_aggregates
from spark_ops.tables import TABLE_SCHEMAS, append_once, ensure_table, overwrite, read_table

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


def test_refreshing_each_unit_gives_the_whole_aggregation_and_leaves_other_keys_alone(spark, tmp_path):
    joined_path, aggregates_path = str(tmp_path / "joined_clicks"), str(tmp_path / "click_aggregates")
    ensure_table(spark, "click_aggregates", aggregates_path)
    # A key no unit below touches, with a value that is not joined_clicks': a refresh leaves it.
    untouched = spark.createDataFrame(
        [("adv9", 0, 7, 7)], "advertiser_id string, minute long, clicks long, cost_micros long"
    ).withColumn("minute", F.timestamp_micros(F.col("minute")))
    overwrite(untouched, "click_aggregates", aggregates_path)

    units = {
        # Two minutes, the second shared with unit b (the last microsecond of its minute too).
        "a": [("a1", T0 + 5, "adv1", 100), ("a2", T0 + MINUTE + 1, "adv1", 10), ("a3", T0 + 2 * MINUTE - 1, "adv2", 1)],
        "b": [("b1", T0 + MINUTE + 30_000_000, "adv1", 1000), ("b2", T0 + 5 * MINUTE, "adv1", 5)],
        # Late clicks of unit c land in a minute unit a also wrote.
        "c": [("c1", T0 + 7, "adv1", 20000)],
    }
    for unit, clicks in units.items():
        append_once(joined_rows(spark, unit, clicks), "joined_clicks", joined_path, unit, 1)
        assert refresh_aggregates(read_table(spark, "joined_clicks", joined_path), unit, aggregates_path)
        expected = as_set(aggregate_clicks(read_table(spark, "joined_clicks", joined_path))) | as_set(untouched)
        assert as_set(read_table(spark, "click_aggregates", aggregates_path)) == expected

    # A retry of a unit recomputes the same values; a unit without joined rows refreshes nothing.
    before = as_set(read_table(spark, "click_aggregates", aggregates_path))
    assert refresh_aggregates(read_table(spark, "joined_clicks", joined_path), "a", aggregates_path)
    assert not refresh_aggregates(read_table(spark, "joined_clicks", joined_path), "none", aggregates_path)
    assert as_set(read_table(spark, "click_aggregates", aggregates_path)) == before
    minute_1 = {r for r in before if r[0] == "adv1" and r[1].timestamp() * 1e6 == T0 + MINUTE}
    assert {(r[2], r[3]) for r in minute_1} == {(2, 1010)}
