"""Asset checks that prove the invariants of docs/CONTRACTS.md on the tables as they are.

Each reports its counts as metadata whether it passes or fails. They count with DuckDB over the
tables as the deltalake reader reads them (spark_ops/verification.py): no Spark session. Ids
registered by a work unit that has not finished yet (running, or failed and awaiting its retry) are
in flight: their output may legitimately not be there yet.
"""


from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg
import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from photon_assets.work_unit import work_units_in_flight
from resources.id_registry import IdRegistryResource
from resources.registry.shards import SCAN_SCHEMA
from resources.settings import PipelineSettings
from resources.storage import WarehouseResource
from spark_ops.aggregates import compared_with_joined
from spark_ops.join import CAPPED_REASON, JoinStats
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


@dg.asset_check(asset="joined_clicks", blocking=True, description="No click_id appears twice in joined_clicks.")
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
    blocking=True,
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
    blocking=True,
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
    asset="joined_clicks",
    description="The replicated registry's replicas hold the same ids: each replica's digest of its id set (count "
    "and a sum of the ids' hashes) at one log revision, compared. Passes with one replica (the registry of one "
    "machine); a replica that does not answer is counted apart (it catches up by itself).",
)
def registry_replicas_agree(registry: IdRegistryResource) -> dg.AssetCheckResult:
    client = registry.get()
    agreement = client.replicas_agreement() if hasattr(client, "replicas_agreement") else {
        "replicas": 1, "replicas_answering": 1, "distinct_id_sets": 1, "revision": None, "digests": {}}
    return dg.AssetCheckResult(
        passed=agreement["distinct_id_sets"] <= 1 and agreement["replicas_answering"] >= 1,
        metadata={**{k: v for k, v in agreement.items() if k != "digests"},
                  "digests": dg.JsonMetadataValue(agreement["digests"])},
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
    blocking=True,
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


# The checks each click run makes of what it wrote (photon_assets/clicks.py yields them), at a cost that
# follows the run's rows. Blocking: a failure fails the run (and its retry follows), and while the latest
# evaluation of one failed, click_aggregates is not refreshed (sensors/upkeep.py).
WORK_UNIT_JOINED_ONCE = "work_unit_joined_once"
WORK_UNIT_ACCOUNTED_FOR = "work_unit_clicks_accounted_for"
WORK_UNIT_CHECK_SPECS = [
    dg.AssetCheckSpec(
        WORK_UNIT_JOINED_ONCE, asset="joined_clicks", blocking=True,
        description="The rows this click run's work unit wrote to joined_clicks: no click_id twice, none also in "
        "its unjoinable_clicks rows, each registered in the id registry (an id written but not registered "
        "could be joined again by another run).",
    ),
    dg.AssetCheckSpec(
        WORK_UNIT_ACCOUNTED_FOR, asset="joined_clicks", blocking=True,
        description="Every distinct click this run's work unit looked up is exactly one of: joined, unjoinable, "
        "pending, or registered by another work unit (skipped or refused); on a first attempt, the rows it wrote "
        "to joined_clicks and unjoinable_clicks are those it counted.",
    ),
]


def work_unit_checks(joined: pa.Table, unjoinable: pa.Table, registered: pa.Table, stats: JoinStats,
                     first_attempt: bool = True) -> list[dg.AssetCheckResult]:
    """The two WORK_UNIT_CHECK_SPECS results, from the rows the unit wrote (`joined`: click_id, `unjoinable`:
    click_id; spark_ops/verification.py: unit_rows), the registry's lookup of the joined ids and the
    pass's counts. A retry may find its unit's rows written by an earlier attempt, counted then as its
    own (held under its token) or as registered elsewhere (its token cleared): its rows are compared with
    its counts only when it is the first attempt."""
    joined_ids = joined["click_id"]
    in_registry = registered.filter(pc.equal(registered["status"], "registered"))["click_id"]
    once = {
        "joined_rows": len(joined),
        "duplicate_rows": len(joined) - len(pc.unique(joined_ids)),
        "also_unjoinable": pc.sum(pc.is_in(joined_ids, value_set=unjoinable["click_id"])).as_py() or 0,
        "not_registered": len(joined) - (pc.sum(pc.is_in(joined_ids, value_set=in_registry)).as_py() or 0),
    }
    elsewhere = stats.skipped_registered + stats.refused
    accounted = {
        "clicks_looked_up": stats.looked_up, "joined": stats.joined, "unjoinable": stats.unjoinable,
        "pending": stats.pending, "registered_elsewhere": elsewhere,
        "unaccounted": stats.looked_up - (stats.joined + stats.unjoinable + stats.pending + elsewhere),
        "joined_rows": len(joined), "unjoinable_rows": len(unjoinable),
        # Outcomes the tables do not hold as counted (first attempts only).
        "rows_not_as_counted": abs(stats.joined - len(joined)) + abs(stats.unjoinable - len(unjoinable))
        if first_attempt else 0,
    }
    return [
        dg.AssetCheckResult(check_name=WORK_UNIT_JOINED_ONCE, asset_key="joined_clicks", metadata=once,
                            passed=once["duplicate_rows"] == once["also_unjoinable"] == once["not_registered"] == 0),
        dg.AssetCheckResult(check_name=WORK_UNIT_ACCOUNTED_FOR, asset_key="joined_clicks", metadata=accounted,
                            passed=accounted["unaccounted"] == accounted["rows_not_as_counted"] == 0),
    ]


ALL_CHECKS = [joined_clicks_unique, clicks_accounted_for, registry_matches_output, aggregates_match_joined_clicks,
              joined_clicks_within_query_cap, registry_replicas_agree]


def blocking_check_keys() -> list[dg.AssetCheckKey]:
    """The checks of joined_clicks that gate what is built on it: the whole-table ones and the work unit's."""
    return [spec.key for spec in [*(s for check in ALL_CHECKS for s in check.check_specs), *WORK_UNIT_CHECK_SPECS]
            if spec.blocking and spec.asset_key == dg.AssetKey("joined_clicks")]


def failed_blocking_checks(instance: dg.DagsterInstance) -> list[str]:
    """The blocking checks whose latest evaluation failed: while one has, click_aggregates is not
    refreshed from joined_clicks (sensors/upkeep.py); a later evaluation that passes lifts it."""
    failed = []
    for key in blocking_check_keys():
        record = instance.get_latest_asset_check_evaluation_record(key)
        # The record's status (AssetCheckExecutionRecordStatus, not exported by dagster) by its value.
        if record is not None and record.status.value == "FAILED":
            failed.append(key.name)
    return failed
