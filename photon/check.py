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
import math
import threading
from dataclasses import dataclass, field

from resources.layout import DataLayout

CHECK_TAGS = {"photon/kind": "check"}
ERROR_CHARS = 300


@dataclass
class CheckOutcome:
    name: str
    asset: str
    passed: bool
    metadata: dict = field(default_factory=dict)  # numbers and strings
    error: str | None = None  # the check raised: no evaluation

    def as_json(self) -> dict:
        record = {"name": self.name, "asset": self.asset, "passed": self.passed, "metadata": self.metadata}
        if self.error is not None:
            record["error"] = self.error
        return record

    def counts(self) -> str:
        """`key=value, ...` of the numeric metadata."""
        return ", ".join(f"{k}={v}" for k, v in self.metadata.items() if is_number(v))

    def failure_line(self) -> str:
        detail = f"error: {self.error}" if self.error is not None else self.counts()
        return f"photon: check failed: {self.name} ({self.asset}): {detail}"

    def passed_line(self) -> str:
        return f"photon: check passed: {self.name} ({self.asset}): {self.counts()}"


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def plain_value(metadata_value):
    """A Dagster metadata value as a number or a string (JSON-safe)."""
    value = getattr(metadata_value, "value", metadata_value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if is_number(value) or isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(value)


def ensure_checkable(layout: DataLayout) -> None:
    """ValueError (a bad invocation) unless the data directory has tables and an instance."""
    if not layout.root.is_dir():
        raise ValueError(f"nothing to check: data directory {layout.root} does not exist")
    if not layout.warehouse.is_dir() or not (layout.dagster_home / "dagster.yaml").is_file():
        missing = "warehouse/" if not layout.warehouse.is_dir() else "Dagster instance (dagster/)"
        raise ValueError(f"nothing to check: run photon run first ({layout.root} has no {missing})")


def one_line(error_info) -> str:
    """The user's exception of a Dagster step failure (the innermost cause), in one line."""
    while getattr(error_info, "cause", None) is not None:
        error_info = error_info.cause
    message = getattr(error_info, "message", None) or str(error_info)
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    # A JVM error through Py4J: "An error occurred while calling o116.count." then ": <the JVM's>".
    if len(lines) > 1 and lines[0].startswith("py4j.protocol.Py4JJavaError") and lines[1].startswith(":"):
        lines = [lines[1].lstrip(": ")]
    text = lines[0] if lines else getattr(error_info, "cls_name", None) or "unknown error"
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 3] + "..."


def outcomes(result) -> list[CheckOutcome]:
    """One outcome per check of ALL_CHECKS, from the checks run's result. A check without an
    evaluation failed, with its step's error (or the run's, if the step never ran)."""
    from photon_assets.checks import ALL_CHECKS

    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    failures = {event.step_key: event for event in result.all_events if event.is_step_failure}
    run_failure = next((event for event in result.all_events if event.is_run_failure), None)
    found = []
    for check in ALL_CHECKS:
        key = check.check_key
        asset = key.asset_key.to_user_string()
        evaluation = evaluations.get(key.name)
        if evaluation is not None:
            metadata = {k: plain_value(v) for k, v in evaluation.metadata.items()}
            found.append(CheckOutcome(key.name, asset, bool(evaluation.passed), metadata))
            continue
        step_failure = failures.get(check.op.name)
        if step_failure is not None and step_failure.step_failure_data.error is not None:
            error = one_line(step_failure.step_failure_data.error)
        elif run_failure is not None:
            cause = run_failure.job_failure_data.error or run_failure.message or "the run failed"
            error = f"did not run: {one_line(cause)} (run {result.run_id})"
        else:
            error = f"no evaluation recorded (run {result.run_id})"
        found.append(CheckOutcome(key.name, asset, False, {}, error))
    return found


def run_checks(layout: DataLayout, datacenters: list[str], log: logging.Logger,
               run_log_level: str = "CRITICAL") -> tuple[list[CheckOutcome], str]:
    """Runs every check as one recorded run of the data directory's instance; returns the outcomes
    and the run id. Raises RunnerError when a `photon run` owns one of the datacenters, or the
    registry is served by another process."""
    from photon.runner import (
        exclusive, headless_instance, prepare_environment, registry_service, run_verify_job, start_spark_session,
    )

    prepare_environment(layout, datacenters, run_log_level)
    with exclusive(layout, datacenters), registry_service(layout, log):
        # The JVM starts while the instance and the definitions load (after the registry's fork).
        threading.Thread(target=start_spark_session, args=(log,), name="spark-session-start", daemon=True).start()
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
