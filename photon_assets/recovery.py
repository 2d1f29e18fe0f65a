"""The recovery job (Photon §3.3.3): output lost after its ids were registered is joined again.

1. Output tables whose data files have gone (storage loss) are rewritten from what remains, and
   a click_id written twice (by a writer outside the pipeline: the uniqueness check finds it) is
   reduced to its earliest row; click_aggregates is then recomputed in full: the rewrites are no
   refresh the change feed could carry on from.
2. Lost ids, and clicks a finished work unit read but left untracked (spark_ops/verification.py),
   are re-injected as pending clicks of the datacenter that read them, from the click ledger, and
   only then unregistered: a crash in between leaves them registered and lost, so the next
   verification finds them again (never nowhere).
3. Tokens of finished work units whose output is confirmed are cleared.
4. Click work units that failed for good after their clicks reached the ledger are marked recovered:
   their clicks are now all joined, pending or unjoinable like any other.
The pending-click dispatchers then join the re-injected clicks like any pending click.
"""

import shutil
from dataclasses import dataclass

import dagster as dg
from pyspark.sql import functions as F

from photon_assets.jobs import REGISTRY_TAGS
from photon_assets.work_unit import (
    PENDING_RETRY,
    TAG_KIND,
    TAG_STREAM,
    TAG_WORK_UNIT,
    mark_recovered,
    runs_failed_for_good,
    work_units_in_flight,
)
from resources.event_store.progress import QueryProgress
from resources.id_registry import IdRegistryResource
from resources.settings import PipelineSettings
from resources.spark.session import SparkResource
from resources.storage import WarehouseResource
from spark_ops.aggregates import refresh_aggregates
from spark_ops.click_pass import pending_policy
from spark_ops.handoff import stage, unstage
from spark_ops.pending import pending_of
from spark_ops.tables import read_table
from spark_ops.verification import (
    RECOVERY_UNIT_PREFIX,
    add_pending,
    confirmed_tokens,
    deduplicate,
    lost_ids,
    reinjected_clicks,
    repair_table,
    untracked_clicks,
    verification_db,
    verified_tables,
)

RECOVER_JOB = "recover_lost_clicks"
# Tables whose lost files recovery can make good: the outputs (re-joined through the registry) and
# the pending clicks (their clicks are in the ledger, unregistered: the checks count them untracked).
REPAIRABLE_TABLES = ("joined_clicks", "unjoinable_clicks", "click_aggregates", "pending_clicks")
# Output tables whose click ids are unique, and the column that says which of two rows came first.
DEDUPLICATED = {"joined_clicks": "joined_at", "unjoinable_clicks": "recorded_at"}


@dg.op(description="Repair output tables after storage loss, remove rows of a click id written twice, re-inject "
       "lost clicks as pending, unregister them, and clear tokens of confirmed output.")
def recover_clicks(
    context: dg.OpExecutionContext,
    spark: SparkResource,
    warehouse: WarehouseResource,
    registry: IdRegistryResource,
    settings: PipelineSettings,
) -> dg.Output[dict]:
    session = spark.session()
    tables = warehouse.tables()
    layout = warehouse.layout
    missing_files = {name: repair_table(session, name, tables[name]) for name in REPAIRABLE_TABLES}
    duplicates = {name: deduplicate(session, name, tables[name], written_at) for name, written_at in DEDUPLICATED.items()}
    if missing_files["joined_clicks"] or missing_files["click_aggregates"] or duplicates["joined_clicks"]:
        refresh_aggregates(session, tables["joined_clicks"], tables["click_aggregates"], full=True)
    staged = layout.staging / f"recovery-{context.run_id}"
    ids = registry.get()
    done = reinject_lost_clicks(context, session, tables, ids, staged)
    counts = done.counts
    # The pending-click dispatchers of these datacenters act on their digests.
    for dc in done.datacenters:
        policy = pending_policy(QueryProgress.load(layout.query_progress_file(dc)), settings)
        policy.digest(tables["pending_clicks"], dc).save(layout.pending_digest_file(dc))
    if counts["without_source"]:
        context.log.error(
            f"{counts['without_source']} lost id(s) have no click in the ledger to re-inject; they stay "
            "registered (and reported by the registry_matches_output check)"
        )
    result = {**counts, "duplicate_rows_removed": duplicates, "tokens_cleared": len(done.tokens),
              "token_ids_cleared": done.token_ids_cleared, "datacenters": done.datacenters, "missing_files": missing_files,
              "recovered_work_units": done.recovered_units}
    context.log.info(f"recovery: {result}")
    return dg.Output(result, metadata={k: dg.JsonMetadataValue(v) if isinstance(v, (dict, list)) else v
                                       for k, v in result.items()})


@dataclass
class Reinjection:
    """What reinject_lost_clicks did."""

    counts: dict  # lost_ids, untracked, reinjected, unregistered, without_source
    tokens: list[str]  # of confirmed output, cleared
    token_ids_cleared: int
    datacenters: list[str]  # re-injected into
    recovered_units: list[str]


def reinject_lost_clicks(context: dg.OpExecutionContext, session, tables: dict[str, str], ids, staged) -> Reinjection:
    """The clicks of lost ids (registered, with no output) and untracked clicks (in the ledger and
    nowhere else) re-injected as pending and unregistered; the tokens of confirmed output cleared; the
    failed click units whose clicks are all accounted for marked recovered."""
    held = []

    def keep(df):
        held.append(df.persist())
        return df

    registered_ids = ids.scan().read_all()
    in_flight = sorted(work_units_in_flight(context.instance))  # after the scan (verification_db)
    with verification_db(verified_tables(tables), registered_ids, in_flight) as db:
        lost_rows, tokens = lost_ids(db), confirmed_tokens(db)
    try:
        registered = unstage(session, registered_ids.to_reader(), staged / "registered")
        joined = read_table(session, "joined_clicks", tables["joined_clicks"])
        unjoinable = read_table(session, "unjoinable_clicks", tables["unjoinable_clicks"])
        failed = runs_failed_for_good(context.instance)
        # With its schema: over Spark Connect an empty Arrow table has none to infer (no id lost).
        lost = session.createDataFrame(lost_rows.select(["click_id", "token"]), schema="click_id string, token string")
        ledger = read_table(session, "click_ledger", tables["click_ledger"])
        pending = pending_of(session, tables["pending_clicks"])
        untracked = keep(untracked_clicks(ledger, registered, joined, unjoinable, pending, in_flight))
        to_reinject = lost.unionByName(untracked)
        reinjected = keep(reinjected_clicks(to_reinject, ledger, f"{RECOVERY_UNIT_PREFIX}.{context.run_id}"))
        counts = {"lost_ids": lost_rows.num_rows, "untracked": untracked.count(), "reinjected": reinjected.count(),
                  "unregistered": 0}
        counts["without_source"] = counts["lost_ids"] + counts["untracked"] - counts["reinjected"]
        # Before the write: it changes pending_clicks, which `untracked` was computed from.
        dcs = sorted(row["dc"] for row in reinjected.select("dc").distinct().collect())
        if counts["reinjected"]:
            add_pending(session, tables["pending_clicks"], reinjected)
            counts["unregistered"] = ids.delete(
                stage(reinjected.select("click_id", "timestamp_us"), staged / "unregister")
            )
        cleared = sum(ids.clear_tokens(token) for token in tokens)
        recovered_units = []
        for record in failed:
            if clicks_accounted(session, tables, record):
                mark_recovered(context.instance, record, context.run_id)
                recovered_units.append(record.dagster_run.tags[TAG_WORK_UNIT])
    finally:
        for df in held:
            df.unpersist()
        shutil.rmtree(staged, ignore_errors=True)
    return Reinjection(counts, tokens, cleared, dcs, recovered_units)


def clicks_accounted(session, tables: dict[str, str], record: dg.RunRecord) -> bool:
    """Whether the clicks of a failed click work unit are all known: a pending-click retry takes
    its clicks from pending_clicks, which it never got to change; new log bytes once their lines
    reached the ledger (or quarantine), which happens in one commit before the join."""
    tags = record.dagster_run.tags
    if tags.get(TAG_STREAM) != "click":
        return False
    if tags.get(TAG_KIND) == PENDING_RETRY:
        return True
    unit = F.col("work_unit") == tags[TAG_WORK_UNIT]
    return any(
        not read_table(session, name, tables[name]).where(unit).isEmpty()
        for name in ("click_ledger", "quarantined_lines")
    )


@dg.job(
    name=RECOVER_JOB,
    tags={**REGISTRY_TAGS, "photon/kind": "recovery"},
    description="Photon §3.3.3 recovery: clicks registered but missing from the output are joined again.",
)
def recover_lost_clicks_job():
    recover_clicks()
