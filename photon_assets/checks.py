"""Asset checks that prove the invariants of DESIGN.md on the tables as they are.

Each reports its counts as metadata whether it passes or fails. Ids registered by a work unit that
has not finished yet (running, or failed and awaiting its retry) are in flight: their output may
legitimately not be there yet.
"""


import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from resources.registry import IdRegistryResource
from resources.spark import SparkResource
from resources.storage import WarehouseResource
from sensors.retries import work_units_in_flight
from spark_ops.aggregates import aggregate_clicks
from spark_ops.handoff import unstage
from spark_ops.tables import read_table
from spark_ops.verification import confirmed_tokens, unresolved_ids

LOST_SAMPLE = 20  # lost ids listed in the check's metadata

def _ids(df: DataFrame) -> DataFrame:
    return df.select("click_id").distinct()


@contextmanager
def registry_frame(spark, registry: IdRegistryResource, warehouse: WarehouseResource, run_id: str) -> Iterator[DataFrame]:
    """Every registered id, staged under the run's own directory (pipelines of other datacenters
    may verify at the same time), removed on exit."""
    path = warehouse.layout.staging / f"verification-{run_id}"
    shutil.rmtree(path, ignore_errors=True)
    registered = unstage(spark, registry.get().scan(), path).persist()
    try:
        yield registered
    finally:
        registered.unpersist()
        shutil.rmtree(path, ignore_errors=True)


@dg.asset_check(asset="joined_clicks", description="No click_id appears twice in joined_clicks.")
def joined_clicks_unique(spark: SparkResource, warehouse: WarehouseResource) -> dg.AssetCheckResult:
    joined = read_table(spark.session(), "joined_clicks", warehouse.tables()["joined_clicks"])
    row = joined.agg(F.count("*").alias("rows"), F.count_distinct("click_id").alias("ids")).first()
    duplicates = row["rows"] - row["ids"]
    return dg.AssetCheckResult(
        passed=duplicates == 0,
        metadata={"dagster/row_count": row["rows"], "distinct_click_ids": row["ids"], "duplicate_rows": duplicates},
    )


@dg.asset_check(
    asset="joined_clicks",
    description="Every distinct valid click seen is exactly one of: joined, unjoinable, pending "
    "(not registered, and known to the pending retries); none is registered without output unless "
    "its work unit is in flight.",
)
def clicks_accounted_for(
    context: dg.AssetCheckExecutionContext,
    spark: SparkResource,
    warehouse: WarehouseResource,
    registry: IdRegistryResource,
) -> dg.AssetCheckResult:
    session = spark.session()
    tables = warehouse.tables()
    seen = _ids(read_table(session, "click_ledger", tables["click_ledger"])).persist()
    joined = _ids(read_table(session, "joined_clicks", tables["joined_clicks"]))
    unjoinable = _ids(read_table(session, "unjoinable_clicks", tables["unjoinable_clicks"]))
    with registry_frame(session, registry, warehouse, context.run.run_id) as registered:
        in_flight = sorted(work_units_in_flight(context.instance))  # after the scan: see unresolved_ids
        resolved = joined.unionByName(unjoinable).distinct()
        # Not registered and not unjoinable (too old for the registry): pending, and then a pending
        # retry must know of it, unless the work unit that read it is still in flight.
        pending = seen.join(registered, "click_id", "left_anti").join(unjoinable, "click_id", "left_anti")
        tracked = _ids(read_table(session, "pending_clicks", tables["pending_clicks"]))
        ledger_in_flight = _ids(
            read_table(session, "click_ledger", tables["click_ledger"]).where(F.col("work_unit").isin(in_flight))
        )
        try:
            counts = {
                "distinct_clicks": seen.count(),
                "joined": joined.count(),
                "unjoinable": unjoinable.count(),
                "pending": pending.count(),
                "pending_untracked": pending.join(tracked, "click_id", "left_anti")
                .join(ledger_in_flight, "click_id", "left_anti").count(),
                "joined_and_unjoinable": joined.join(unjoinable, "click_id").count(),
                "output_never_seen": resolved.join(seen, "click_id", "left_anti").count(),
                "registered_without_output": unresolved_ids(registered, joined, unjoinable, in_flight)
                .join(seen, "click_id", "left_semi").count(),
                "work_units_in_flight": len(in_flight),
            }
        finally:
            seen.unpersist()
    passed = all(counts[k] == 0 for k in ("joined_and_unjoinable", "output_never_seen", "registered_without_output", "pending_untracked"))
    return dg.AssetCheckResult(passed=passed, metadata=counts)


@dg.asset_check(
    asset="joined_clicks",
    description="Verification (Photon §3.3.3): lists registered ids whose output is in neither "
    "joined_clicks nor unjoinable_clicks although no work unit that could write it is in flight "
    "(lost: the recover_lost_clicks job re-injects them), and counts finished work units whose "
    "tokens were never cleared.",
)
def registry_matches_output(
    context: dg.AssetCheckExecutionContext,
    spark: SparkResource,
    warehouse: WarehouseResource,
    registry: IdRegistryResource,
) -> dg.AssetCheckResult:
    session = spark.session()
    tables = warehouse.tables()
    with registry_frame(session, registry, warehouse, context.run.run_id) as registered:
        in_flight = sorted(work_units_in_flight(context.instance))  # after the scan: see unresolved_ids
        joined = read_table(session, "joined_clicks", tables["joined_clicks"])
        unjoinable = read_table(session, "unjoinable_clicks", tables["unjoinable_clicks"])
        lost = unresolved_ids(registered, joined, unjoinable, in_flight).persist()
        try:
            counts = {
                "registered_ids": registered.count(),
                "ids_with_token": registered.where(F.col("token").isNotNull()).count(),
                "lost_ids": lost.count(),
                "lost_ids_with_token": lost.where(F.col("token").isNotNull()).count(),
                "tokens_to_clear": confirmed_tokens(registered, joined, unjoinable, in_flight).count(),
                "work_units_in_flight": len(in_flight),
            }
            sample = [row["click_id"] for row in lost.select("click_id").orderBy("click_id").limit(LOST_SAMPLE).collect()]
        finally:
            lost.unpersist()
    return dg.AssetCheckResult(
        passed=counts["lost_ids"] == 0,
        metadata={**counts, "lost_click_ids_sample": dg.JsonMetadataValue(sample)},
    )


@dg.asset_check(asset="click_aggregates", description="click_aggregates equals the aggregation of joined_clicks.")
def aggregates_match_joined_clicks(spark: SparkResource, warehouse: WarehouseResource) -> dg.AssetCheckResult:
    session = spark.session()
    tables = warehouse.tables()
    expected = aggregate_clicks(read_table(session, "joined_clicks", tables["joined_clicks"]))
    actual = read_table(session, "click_aggregates", tables["click_aggregates"])
    keys = ["advertiser_id", "minute"]
    compared = expected.alias("e").join(actual.alias("a"), keys, "full_outer")
    mismatched = compared.where(
        ~F.col("e.clicks").eqNullSafe(F.col("a.clicks")) | ~F.col("e.cost_micros").eqNullSafe(F.col("a.cost_micros"))
    ).count()
    totals = actual.agg(F.count("*").alias("rows"), F.sum("clicks").alias("clicks")).first()
    return dg.AssetCheckResult(
        passed=mismatched == 0,
        metadata={
            "dagster/row_count": totals["rows"],
            "clicks_total": totals["clicks"] or 0,
            "mismatched_keys": mismatched,
        },
    )


ALL_CHECKS = [joined_clicks_unique, clicks_accounted_for, registry_matches_output, aggregates_match_joined_clicks]
