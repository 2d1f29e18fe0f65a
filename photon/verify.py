"""What `photon run` and `photon check` do once the pipeline is idle: the `verify` job (every asset
check, with the tables locked), and the recovery job when a check finds output lost; both executed in
this process as recorded runs of the instance, from the code location built once."""

import functools
import logging
import os

import dagster as dg

from photon.check_outcomes import CheckOutcome, outcomes
from photon.deployment import RunnerError
from photon_assets.jobs import VERIFY_JOB
from resources.state.layout import TABLES, DataLayout
from sensors.dispatcher import RUN_LOG_LEVEL_ENV
from spark_ops.tables import table_committed, tables_locked

MAX_RECOVERY_ROUNDS = 2  # recovery, then pipeline and verification again; more would repeat itself


def storage_lost(layout: DataLayout) -> bool:
    """Whether a table recovery can repair references data files that are gone."""
    from photon_assets.recovery import REPAIRABLE_TABLES
    from spark_ops.verification import missing_data_files

    paths = [layout.table(name) for name in REPAIRABLE_TABLES if table_committed(layout.table(name))]
    return any(missing_data_files(path) for path in paths)


def recover(instance: dg.DagsterInstance, log: logging.Logger) -> dict:
    """Runs the recovery job as a recorded run of the instance; returns what it did."""
    from photon_assets.recovery import RECOVER_JOB

    result = execute_job(instance, RECOVER_JOB)
    if not result.success:
        raise RunnerError(f"the recovery job failed (run {result.run_id}); see its logs in the Dagster UI")
    outcome = result.output_for_node("recover_clicks")
    log.info("recovery: %s", outcome)
    return outcome


def recovery_did_work(outcome: dict) -> bool:
    return bool(outcome["reinjected"] or outcome["token_ids_cleared"] or any(outcome["missing_files"].values()))

@functools.cache
def code_location() -> dg.Definitions:
    """The code location whose jobs this process executes, built once, on first use: it reads the
    data directory from the environment."""
    from photon.code_location import definitions_from_env

    return definitions_from_env()


def execute_job(instance: dg.DagsterInstance, job_name: str, tags: dict | None = None,
                asset_check_selection: set[dg.AssetCheckKey] | None = None):
    """Runs a job of the code location in this process, as a recorded run of the instance; with
    `asset_check_selection`, only those checks of it (a subset run: no asset is materialized)."""
    job = code_location().resolve_job_def(job_name)
    if asset_check_selection is not None:
        job = job.get_subset(asset_check_selection=asset_check_selection)
    return job.execute_in_process(
        run_config={"loggers": {"console": {"config": {"log_level": os.environ[RUN_LOG_LEVEL_ENV]}}}},
        instance=instance,
        raise_on_error=False,
        tags=tags,
    )


def run_verify_job(instance: dg.DagsterInstance, layout: DataLayout, checks_only: bool = False,
                   tags: dict | None = None):
    """Runs the `verify` job (the aggregate refreshed from the change feed, then every asset check,
    whose aggregates check compares it with a full aggregation; with `checks_only`,
    the checks alone, reading the tables as they are) as a recorded run of the instance, with every
    table locked: a pipeline of another datacenter in another process waits at its next commit, so
    that the checks see one consistent state. Returns the ExecuteInProcessResult."""
    from photon_assets.checks import ALL_CHECKS

    selection = {check.check_key for check in ALL_CHECKS} if checks_only else None
    with tables_locked([layout.table(name) for name in TABLES]):
        return execute_job(instance, VERIFY_JOB, tags=tags or {"photon/kind": "verify"},
                           asset_check_selection=selection)


def pending_clicks(checks: list[CheckOutcome]) -> int | None:
    """The pending clicks clicks_accounted_for counted (photon_assets/checks.py, the one home of which
    clicks are pending); None if that check raised."""
    from photon_assets.checks import clicks_accounted_for

    name = clicks_accounted_for.check_key.name
    return next(check.metadata.get("pending") for check in checks if check.name == name)


def verify(instance: dg.DagsterInstance, layout: DataLayout) -> list[CheckOutcome]:
    """The `verify` job's outcome per check (see run_verify_job)."""
    return outcomes(run_verify_job(instance, layout))
