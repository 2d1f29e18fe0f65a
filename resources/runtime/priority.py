"""The CPU priority of the work kept off the click path (issue 42, item 5).

On two cores the click runs share the CPU with the query runs that build the durable tier, the
aggregates refresh, table maintenance and the table checks. Those have no deadline a click waits for,
so they run at a lower priority (a higher nice value): the kernel gives the click path the cores it
asks for, and the rest what is left. Linux keeps a nice value per thread, and a thread or process
started by one inherits it: `photon run` lowers the thread that runs its off-click-path passes (the
DuckDB and Arrow threads those runs start inherit it), `photon up`'s run server lowers the process of
such a run after its fork. Lowering needs no privilege; nothing here raises a priority again. What
was lowered is also what the Spark work is tagged off the click path for (`off_click_path`;
resources/spark/task_priority.py lowers those tasks in the JVM).
"""

from __future__ import annotations

import logging
import os
import threading

# The nice value of the work off the click path. Under CFS a thread at nice 10 weighs 110 against a
# normal thread's 1024: beside a busy click run it gets about a tenth of a core, alone all of it.
OFF_CLICK_PATH_NICE = 10

log = logging.getLogger(__name__)
_lowered_process = False
_lowered_thread = threading.local()


def off_click_path() -> bool:
    """Whether this thread (or this whole process) was lowered as work off the click path."""
    return _lowered_process or getattr(_lowered_thread, "lowered", False)


def lower_this_thread(nice: int = OFF_CLICK_PATH_NICE) -> None:
    """This thread (and what it starts from now on) at `nice`, unless it is there or lower already."""
    _lower(threading.get_native_id(), nice)
    _lowered_thread.lowered = True


def lower_this_process(nice: int = OFF_CLICK_PATH_NICE) -> None:
    """This process's calling thread at `nice` (called in a process that has one thread: a fork)."""
    global _lowered_process
    _lower(0, nice)
    _lowered_process = True


def _lower(who: int, nice: int) -> None:
    try:
        if os.getpriority(os.PRIO_PROCESS, who) < nice:
            os.setpriority(os.PRIO_PROCESS, who, nice)
    except OSError as error:  # a sandbox without setpriority: the work runs at its parent's priority
        log.warning("could not lower the CPU priority of the work off the click path: %s", error)
