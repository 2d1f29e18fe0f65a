"""The `verify` job's result read as one outcome per check of ALL_CHECKS (photon_assets/checks.py):
passed or not, its counts as plain values, or the error that kept it from an evaluation. `photon
check` prints them; `photon run` decides on recovery and takes its summary's click counts from them."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

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
