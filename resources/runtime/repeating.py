"""A body run over and over on a thread of its own while a block runs: the lease renewal of
`photon run` / `photon up` (resources/registry/work_claims.py) and `photon run`'s passes of the sensors off the
click path (photon/runner.py)."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable


@contextmanager
def repeated(body: Callable[[], None], every_seconds: float, name: str, wait_seconds: float | None = None):
    """Runs `body` on a daemon thread, its starts at least `every_seconds` apart, until the block
    ends; then waits for the body under way to return, at most `wait_seconds` if given (a body stuck
    on a service that is gone is left to the process's exit). The body handles its own errors."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            started = time.monotonic()
            body()
            stop.wait(max(0.0, every_seconds - (time.monotonic() - started)))

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(wait_seconds)
