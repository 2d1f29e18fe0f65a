"""Asset checks that prove the invariants of docs/CONTRACTS.md on the tables as they are.

Each reports its counts as metadata whether it passes or fails. They count with DuckDB over the
tables as the deltalake reader reads them (spark_ops/verification.py): no Spark session. Ids
registered by a work unit that has not finished yet (running, or failed and awaiting its retry) are
in flight: their output may legitimately not be there yet.
"""


import datetime
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg
import duckdb

from photon_assets.work_unit import work_units_in_flight
from resources.id_registry import IdRegistryResource
from resources.registry.shards import SCAN_SCHEMA
from resources.settings import PipelineSettings
from resources.storage import WarehouseResource
from spark_ops.aggregates import compared_with_joined
from spark_ops.join import CAPPED_REASON
from spark_ops.tables import latest_version, one_row, table_committed
from spark_ops.verification import click_accounting, registry_counts, verification_db, verified_tables

LOST_SAMPLE = 20  # lost ids listed in the check's metadata


@contextmanager
def verified(context, warehouse: WarehouseResource, registry: IdRegistryResource | None = None
             ) -> Iterator[tuple[duckdb.DuckDBPyConnection, int]]:
    """The verification database (spark_ops/verification.py) over the tables and, given the registry,
    its ids; and how many work units are in flight (read after the registry's scan)."""
    registered = SCAN_SCHEMA.empty_table() if registry is None else registry.get().scan().read_all()
    in_flight = sorted(work_units_in_flight(context.instance)) if registry is not None else []
    with verification_db(verified_tables(warehouse.tables()), registered, in_flight) as db:
        yield db, len(in_flight)


@dg.asset_check(asset="joined_clicks", description="No click_id appears twice in joined_clicks.")
def joined_clicks_unique(context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource) -> dg.AssetCheckResult:
    with verified(context, warehouse) as (db, _):
        row = one_row(db, "SELECT count(*) AS rows, count(DISTINCT click_id) AS ids FROM joined_clicks")
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
    context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource, registry: IdRegistryResource,
) -> dg.AssetCheckResult:
    with verified(context, warehouse, registry) as (db, in_flight):
        counts = {**click_accounting(db), "work_units_in_flight": in_flight}
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
    context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource, registry: IdRegistryResource,
) -> dg.AssetCheckResult:
    with verified(context, warehouse, registry) as (db, in_flight):
        counts = {**registry_counts(db), "work_units_in_flight": in_flight}
        sample = [row[0] for row in db.sql(
            f"SELECT click_id FROM outcomes WHERE lost ORDER BY click_id LIMIT {LOST_SAMPLE}").fetchall()]
    return dg.AssetCheckResult(
        passed=counts["lost_ids"] == 0,
        metadata={**counts, "lost_click_ids_sample": dg.JsonMetadataValue(sample)},
    )


@dg.asset_check(
    asset="click_aggregates",
    description="click_aggregates equals the aggregation of joined_clicks at the version its last refresh "
    "names (refreshes run off the click path: they may lag, by joined_clicks_versions_behind).",
)
def aggregates_match_joined_clicks(warehouse: WarehouseResource) -> dg.AssetCheckResult:
    tables = warehouse.tables()
    compared = compared_with_joined(tables["click_aggregates"], tables["joined_clicks"])
    through = -1 if compared["joined_clicks_version"] is None else compared["joined_clicks_version"]
    latest = latest_version(tables["joined_clicks"]) if table_committed(tables["joined_clicks"]) else -1
    return dg.AssetCheckResult(
        passed=compared["mismatched_keys"] == 0,
        metadata={
            "dagster/row_count": compared["rows"],
            "clicks_total": compared["clicks"],
            "mismatched_keys": compared["mismatched_keys"],
            "joined_clicks_version": through,
            "joined_clicks_versions_behind": latest - through,
        },
    )


@dg.asset_check(
    asset="joined_clicks",
    description="No query has more joined clicks than max_clicks_per_query (when set); clicks past it "
    "are in unjoinable_clicks with reason capped. Reports the largest query's joined clicks either way.",
)
def joined_clicks_within_query_cap(
    context: dg.AssetCheckExecutionContext, warehouse: WarehouseResource, settings: PipelineSettings,
) -> dg.AssetCheckResult:
    cap = settings.max_clicks_per_query
    with verified(context, warehouse) as (db, _):
        row = one_row(db, f"""
            SELECT coalesce(max(n), 0) AS largest, count(*) FILTER (WHERE n > {int(cap)} AND {int(cap)} > 0) AS over,
                   (SELECT count(*) FROM unjoinable_clicks WHERE reason = '{CAPPED_REASON}') AS capped
            FROM (SELECT count(*) AS n FROM joined_clicks GROUP BY query_id)""")
    return dg.AssetCheckResult(
        passed=row["over"] == 0,
        metadata={"max_clicks_per_query": cap, "largest_query_joined_clicks": row["largest"],
                  "queries_over_cap": row["over"], "clicks_capped": row["capped"]},
    )


def joined_clicks_freshness(fresh_within_seconds: float) -> list[dg.AssetChecksDefinition]:
    """Fails when joined_clicks has not been materialized for `fresh_within_seconds`: under live
    logs every click pass materializes it. It judges the pipeline's liveness, not the tables'
    content, so it is not among ALL_CHECKS (`verify`, `photon check`): a data directory processed
    yesterday is correct, not stale. Its sensor (sensors/freshness.py) runs it under the daemon.

    Dagster 1.13 prefers FreshnessPolicy, still in preview: evaluated only by a daemon with
    `freshness: enabled` set, it cannot run in `materialize` or a test; a check can."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.SupersessionWarning)
        return list(dg.build_last_update_freshness_checks(
            assets=["joined_clicks"], lower_bound_delta=datetime.timedelta(seconds=fresh_within_seconds),
            severity=dg.AssetCheckSeverity.ERROR,
        ))


ALL_CHECKS = [joined_clicks_unique, clicks_accounted_for, registry_matches_output, aggregates_match_joined_clicks,
              joined_clicks_within_query_cap]
