"""Fault injection for the crash tests: `PHOTON_FAULT=<point>:<raise|kill>` makes the first work unit
that reaches `<point>` fail there, by raising or by SIGKILL of its own process. Each fault
(`<point>:<mode>`) fires once per data directory (a marker file records it), so the retry that
follows runs clean."""

from __future__ import annotations

import os
import signal
from pathlib import Path

FAULT_ENV = "PHOTON_FAULT"


class InjectedFault(RuntimeError):
    pass


def fault_marker(state_dir: Path, point: str, mode: str) -> Path:
    return state_dir / "faults" / f"{point}.{mode}"


def checkpoint(point: str, state_dir: Path) -> None:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    target, _, mode = spec.partition(":")
    if target != point:
        return
    mode = mode or "raise"
    marker = fault_marker(state_dir, point, mode)
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise InjectedFault(f"injected fault at {point}")
