"""A graceful stop for a long body run in-process: `photon run`'s drain.

Dagster executes an in-process run under `capture_interrupts` when it runs on the main thread: the
run's SIGINT is recorded by Dagster's own handler, turned into an interrupted step at best, and forgotten
when the run ends, so a Ctrl-C landing during a click run was lost and `photon run` went on tailing. The
body therefore runs on a thread of its own (Dagster leaves signal handlers alone off the main thread)
and the main thread only waits and takes the signals: the first SIGINT or SIGTERM sets the event the
body polls between its passes (the runs under way finish; state is kept), a second one stops at once."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Callable, TypeVar

T = TypeVar("T")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def run_stoppable(body: Callable[[threading.Event], T], log: logging.Logger, name: str) -> T:
    """`body(stop)` on a thread named `name`; its result, or its exception re-raised here. Off the main
    thread (a caller that cannot own signals) the body runs in place with an event nobody sets."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        return body(stop)

    def on_signal(signum: int, _frame) -> None:
        if stop.is_set():
            raise KeyboardInterrupt  # the second: at once (every write is crash-safe)
        stop.set()
        log.warning("signal %d: stopping after the pass under way (send it again to stop at once)", signum)

    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            outcome["result"] = body(stop)
        except BaseException as error:  # handed to the main thread, which raises it
            outcome["error"] = error

    previous = {signum: signal.signal(signum, on_signal) for signum in STOP_SIGNALS}
    try:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.5)  # a bounded wait: the handlers run on this thread between waits
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]
