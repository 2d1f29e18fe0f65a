"""What one run spends: wall time by phase and the Delta commits it makes.

A run opens a `PassMeter` (`metered`); the table writers (spark_ops/tables.py) count their commits
into the meter of the run that calls them, so a run's metadata can say what its pass cost. Spark
jobs are counted by the Spark resource (resources/spark/session.py), which knows the session's mode.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

_current: ContextVar["PassMeter | None"] = ContextVar("photon_pass_meter", default=None)


@dataclass
class PassMeter:
    phases: dict[str, float] = field(default_factory=dict)
    commits: Counter = field(default_factory=Counter)  # table name -> Delta commits
    _mark: float = field(default_factory=time.monotonic)

    def phase(self, name: str) -> None:
        """Ends the phase `name`: the time since the previous phase ended (or the meter started)."""
        now = time.monotonic()
        self.phases[name] = round(self.phases.get(name, 0.0) + now - self._mark, 3)
        self._mark = now

    def metadata(self) -> dict[str, float | int]:
        return {
            **{f"phase_{name}_seconds": seconds for name, seconds in self.phases.items()},
            "delta_commits": sum(self.commits.values()),
            **{f"delta_commits_{table}": n for table, n in sorted(self.commits.items())},
        }


@contextmanager
def metered() -> Iterator[PassMeter]:
    meter = PassMeter()
    token = _current.set(meter)
    try:
        yield meter
    finally:
        _current.reset(token)


def count_commit(table: str) -> None:
    meter = _current.get()
    if meter is not None:
        meter.commits[table] += 1
