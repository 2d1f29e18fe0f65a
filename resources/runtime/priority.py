"""The CPU priority of the work kept off the click path (issue 42, item 5).

On two cores the click runs share the CPU with the query runs that build the durable tier, the
aggregates refresh, table maintenance and the table checks. Those have no deadline a click waits for,
so they run at a lower priority (a higher nice value): the kernel gives the click path the cores it
asks for, and the rest what is left. Linux keeps a nice value per thread, and a thread or process
started by one inherits it: `photon run` sets the thread that runs its off-click-path passes (the
DuckDB and Arrow threads those runs start inherit it), `photon up`'s run server lowers the process of
such a run after its fork. What a thread's priority is also says whether its Spark work is tagged off
the click path (`off_click_path`; resources/task_priority.py lowers those tasks in the JVM).

The query runs are off the click path only while their datacenter is live. While it catches up (its
clicks' watermark lags the clock by more than `catch_up_lag_seconds`: back from an outage, a backlog,
a pipeline that fell behind), clicks whose queries the memory tier no longer holds wait for the
durable tier those runs build, and a query run at the lower priority behind the click runs of two
datacenters advanced it slowly: a 10-minute outage caught up at 2.37x the live rate with every run
off the click path lowered, 4.83x with none (benchmarks/README.md, round twenty-four). So the query
runs' priority follows that state (`query_run_nice`); the refresh, maintenance and checks, which no
click ever waits for, stay lowered. Lowering needs no privilege; raising a thread back (`photon run`'s,
when its datacenter starts catching up) needs CAP_SYS_NICE (root), and without it the thread stays
where it is.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from resources.state.layout import DataLayout
from resources.state.sidecars import EventTimeWatermark

# The nice value of the work off the click path. Under CFS a thread at nice 10 weighs 110 against a
# normal thread's 1024: beside a busy click run it gets about a tenth of a core, alone all of it.
OFF_CLICK_PATH_NICE = 10

log = logging.getLogger(__name__)
# The priority this process started at (its main thread's, read at import): the click path's. A run
# server's fork inherits the server's.
NORMAL_NICE = os.getpriority(os.PRIO_PROCESS, 0)
_warned = set()


def off_click_path() -> bool:
    """Whether this thread runs lowered as work off the click path (its own nice value, which a thread
    started by a lowered one inherits, above the process's normal one)."""
    return _nice(threading.get_native_id()) > NORMAL_NICE


def lower_this_thread(nice: int = OFF_CLICK_PATH_NICE) -> None:
    """This thread (and what it starts from now on) at `nice`, unless it is there or lower already."""
    who = threading.get_native_id()
    if _nice(who) < nice:
        _set(who, nice)


def lower_this_process(nice: int = OFF_CLICK_PATH_NICE) -> None:
    """This process's calling thread at `nice` (called in a process that has one thread: a fork)."""
    if _nice(0) < nice:
        _set(0, nice)


def set_this_thread(nice: int) -> None:
    """This thread (and what it starts from now on) at `nice`, never above the process's normal
    priority: lowered, or raised back where this process may (else it stays where it is)."""
    who, nice = threading.get_native_id(), max(nice, NORMAL_NICE)
    if _nice(who) != nice:
        _set(who, nice)


def catching_up(layout: DataLayout, dc: str, catch_up_lag_seconds: float, now_us: int | None = None) -> bool:
    """Whether `dc` catches up: its click stream's event-time watermark (written by its click runs)
    lags the clock by more than `catch_up_lag_seconds`, or it has none yet (no click run yet)."""
    now_us = time.time_ns() // 1000 if now_us is None else now_us
    lag = EventTimeWatermark.load(layout.watermark_file(dc, "click")).lag_seconds(now_us)
    return lag is None or lag > catch_up_lag_seconds


def query_run_nice(layout: DataLayout, dcs: list[str], catch_up_lag_seconds: float, now_us: int | None = None) -> int:
    """The priority of the query runs of `dcs`: the click path's while one of them catches up
    (`catching_up`: its clicks may wait for the durable tier), else OFF_CLICK_PATH_NICE."""
    if any(catching_up(layout, dc, catch_up_lag_seconds, now_us) for dc in dcs):
        return NORMAL_NICE
    return OFF_CLICK_PATH_NICE


def _nice(who: int) -> int:
    try:
        return os.getpriority(os.PRIO_PROCESS, who)
    except OSError:  # a thread that just ended
        return NORMAL_NICE


def _set(who: int, nice: int) -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, who, nice)
    except OSError as error:  # a sandbox without setpriority, or a raise without CAP_SYS_NICE
        raising = nice < _nice(who)
        if raising not in _warned:  # once per kind: a pass sets its thread every second
            _warned.add(raising)
            log.warning("could not %s the CPU priority of the work off the click path (nice %d): %s",
                        "raise" if raising else "lower", nice, error)
