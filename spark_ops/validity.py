"""Timestamp validity (Facebook §6.7): what an absurd event time does to the pipeline.

A click more than `future_tolerance_seconds` ahead of the pipeline's clock, or more than
`before_query_tolerance_seconds` before its query, is resolved at once as unjoinable with its
reason: it does not wait for retries (a query that late would never come). A click older than the
registry's GC boundary is already resolved as too old by the registry. A query from the future is
kept in the EventStore, but neither kind of future event moves the stream's progress (pacing,
pending retries, the unjoinable age and the event-time lag read it).

The clock is the work unit's (`WorkUnitConfig.clock_us`: when the dispatcher cut it), the same in
every attempt, so that a retry judges a click as its first attempt did.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column
from pyspark.sql import functions as F

FUTURE_REASON = "timestamp in the future of the pipeline's clock"
BEFORE_QUERY_REASON = "timestamp before its query's"
LATEST_VALID = "latest_valid_us"  # the column of `latest_valid_us` (run_values)


@dataclass(frozen=True)
class TimestampValidity:
    clock_us: int
    future_tolerance_us: int
    before_query_tolerance_us: int

    @classmethod
    def of(cls, clock_us: int, future_tolerance_seconds: float, before_query_tolerance_seconds: float):
        return cls(clock_us, int(future_tolerance_seconds * 1e6), int(before_query_tolerance_seconds * 1e6))

    @property
    def latest_valid_us(self) -> int:
        """The newest event time that counts: later ones are from the future."""
        return self.clock_us + self.future_tolerance_us

    def run_values(self) -> dict[str, int]:
        """The values `from_future` reads from its frame, a column each (spark_ops/registry_calls.py: lookup_clicks)."""
        return {LATEST_VALID: self.latest_valid_us}

    def from_future(self, timestamp: Column) -> Column:
        """On a frame that carries `run_values()`."""
        return timestamp > F.col(LATEST_VALID)

    def before_query(self, click_timestamp: Column, query_timestamp: Column) -> Column:
        return click_timestamp < query_timestamp - F.lit(self.before_query_tolerance_us)
