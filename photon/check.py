"""`photon check`: every asset check of the project against a data directory, through Dagster.

The checks (photon_assets/checks.py, ALL_CHECKS) run as a checks-only run of the `verify` job in
the data directory's Dagster instance (`<data-dir>/dagster`), so their results show in the Dagster
UI next to those of `photon run`. Nothing is materialized: unlike `photon run`'s verification, the
aggregate is not refreshed first, so that the checks judge the tables as they are.

It uses the runner's machinery: the datacenters' `photon run` locks (a check refuses to start while
a `photon run` owns one of them, and a `photon run` cannot start during a check), the local registry
service for the duration (unless PHOTON_REGISTRY_ADDRESS is set), every table's commit lock during
the checks (a pipeline of another datacenter pauses at its next commit), and the instance.
"""

from __future__ import annotations

import json
import logging

from photon.check_outcomes import CheckOutcome, outcomes
from resources.state.layout import DataLayout

CHECK_TAGS = {"photon/kind": "check"}


def ensure_checkable(layout: DataLayout) -> None:
    """ValueError (a bad invocation) unless the data directory has tables and an instance."""
    if not layout.root.is_dir():
        raise ValueError(f"nothing to check: data directory {layout.root} does not exist")
    if not layout.warehouse.is_dir() or not (layout.dagster_home / "dagster.yaml").is_file():
        missing = "warehouse/" if not layout.warehouse.is_dir() else "Dagster instance (dagster/)"
        raise ValueError(f"nothing to check: run photon run first ({layout.root} has no {missing})")


def run_checks(layout: DataLayout, datacenters: list[str], log: logging.Logger,
               run_log_level: str = "CRITICAL") -> tuple[list[CheckOutcome], str]:
    """Runs every check as one recorded run of the data directory's instance; returns the outcomes
    and the run id. Raises RunnerError when a `photon run` owns one of the datacenters, or the
    registry is served by another process."""
    from photon.registry_cluster import registry_for
    from photon.deployment import exclusive, headless_instance, prepare_environment
    from photon.supervisor import Supervisor
    from photon.verify import run_verify_job

    prepare_environment(layout, datacenters, run_log_level)
    # No Spark session: the checks read the tables with DuckDB (spark_ops/verification.py).
    with exclusive(layout, datacenters), Supervisor(log) as supervisor, registry_for(supervisor, layout, None):
        instance = headless_instance(layout)
        result = run_verify_job(instance, layout, checks_only=True, tags=CHECK_TAGS)
        return outcomes(result), result.run_id


def report(checks: list[CheckOutcome], run_id: str, as_json: bool, out, err) -> int:
    """Prints the outcomes: passed checks on `out`, one `photon: check failed:` line per failed one
    on `err`, then (as_json) one JSON object as the last line of `out`. Returns the exit status."""
    passed = all(check.passed for check in checks)
    for check in checks:
        if check.passed:
            print(check.passed_line(), file=out)
    for check in checks:
        if not check.passed:
            print(check.failure_line(), file=err)
    if as_json:
        print(json.dumps({"passed": passed, "run_id": run_id, "checks": [c.as_json() for c in checks]},
                         sort_keys=True), file=out)
    return 0 if passed else 1
