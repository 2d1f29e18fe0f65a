"""Jobs: one per kind of work unit, the refresh of the aggregates, and the verification job that runs
the asset checks (table maintenance is photon_assets/maintenance.py's).

Micro-batch jobs run in-process (one step process per run, not per asset). A click run carries only the
checks of what it wrote (photon_assets/checks.py, WORK_UNIT_CHECK_SPECS), blocking; the checks that scan
whole tables run in `verify` (photon run, photon check) and, under the daemon, in `check_tables` runs
(sensors/upkeep.py), off the click path."""

from __future__ import annotations

import dagster as dg

from photon_assets.checks import ALL_CHECKS, WORK_UNIT_CHECK_SPECS
from resources.id_registry import registry_mode_from_env

INGEST_QUERIES_JOB = "ingest_queries"
JOIN_CLICKS_JOB = "join_clicks_job"
REFRESH_AGGREGATES_JOB = "refresh_aggregates"
CHECK_TABLES_JOB = "check_tables"
# Per stream: the job that runs its work units, and the op whose config names the unit.
STREAM_JOBS = {"query": (INGEST_QUERIES_JOB, "ingest_query_logs"), "click": (JOIN_CLICKS_JOB, "join_clicks")}
VERIFY_JOB = "verify"
# Runs of these jobs open the embedded registry, a DuckDB file that one process at a time may hold:
# under the daemon, dagster.yaml allows one such run at a time (photon/deployment.py: DAGSTER_YAML). With the
# registry service (`photon up`, PHOTON_REGISTRY_ADDRESS) no run opens the file: no tag, no limit.
REGISTRY_TAGS = {"photon/uses_registry": "true"} if registry_mode_from_env() == "embedded" else {}
# The work units' runs are the latency path: under the daemon's queue they go before the runs kept
# off it (aggregates, maintenance, checks), and dagster.yaml (photon/deployment.py: DAGSTER_YAML) gives them two of its
# three run slots (by their `photon/work_unit` tag), the runs off the click path the third: neither
# kind waits for the other's slot.
WORK_UNIT_TAGS = {**REGISTRY_TAGS, "dagster/priority": "1"}
OFF_CLICK_PATH_TAGS = {"photon/off_click_path": "true"}

ingest_queries_job = dg.define_asset_job(
    INGEST_QUERIES_JOB,
    selection=dg.AssetSelection.assets("query_logs", "log_file_map").without_checks(),
    executor_def=dg.in_process_executor,
    tags=WORK_UNIT_TAGS,  # a query run puts its lines in the memory tier, held by the registry
    description="Parse one work unit of query logs into query_logs and log_file_map.",
)

# A click run's assets and the checks of what it wrote (its op yields them: they cannot be left out).
CLICK_RUN_SELECTION = (dg.AssetSelection.assets("click_ledger", "joined_clicks", "unjoinable_clicks").without_checks()
                       | dg.AssetSelection.checks(*[spec.key for spec in WORK_UNIT_CHECK_SPECS]))

join_clicks_job = dg.define_asset_job(
    JOIN_CLICKS_JOB,
    selection=CLICK_RUN_SELECTION,
    executor_def=dg.in_process_executor,
    tags=WORK_UNIT_TAGS,
    description="Join one work unit of clicks (new log bytes, or pending clicks) exactly once.",
)

refresh_aggregates_job = dg.define_asset_job(
    REFRESH_AGGREGATES_JOB,
    selection=dg.AssetSelection.assets("click_aggregates").without_checks(),
    executor_def=dg.in_process_executor,
    tags=OFF_CLICK_PATH_TAGS,
    description="Refresh click_aggregates with the rows joined since its last refresh (off the click path).",
)

check_tables_job = dg.define_asset_job(
    CHECK_TABLES_JOB,
    selection=dg.AssetSelection.checks(*ALL_CHECKS),
    executor_def=dg.in_process_executor,
    tags={**REGISTRY_TAGS, **OFF_CLICK_PATH_TAGS, "photon/kind": "checks"},
    description="Every whole-table check (completeness, uniqueness, registry and output, aggregates, caps) over "
    "the tables as they are, nothing materialized: requested by the table_checks sensor under the daemon.",
)

verify_job = dg.define_asset_job(
    VERIFY_JOB,
    selection=dg.AssetSelection.assets("click_aggregates") | dg.AssetSelection.checks(*ALL_CHECKS),
    executor_def=dg.in_process_executor,
    tags=REGISTRY_TAGS,
    description="Refresh click_aggregates from the change feed, then run every invariant check over the output tables "
    "and the registry (photon run holds every table's lock meanwhile).",
)
