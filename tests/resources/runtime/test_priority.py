"""The CPU priority of the work off the click path (resources/runtime/priority.py): a thread lowered
alone, the threads it starts inheriting it; raised back only to the process's normal priority; and
the query runs' priority following whether their datacenter catches up."""

import os
import threading

import pytest

from resources import task_priority
from resources.runtime.priority import (NORMAL_NICE, OFF_CLICK_PATH_NICE, catching_up, lower_this_thread,
                                        off_click_path, query_run_nice, set_this_thread)
from resources.state.layout import DataLayout
from resources.state.sidecars import EventTimeWatermark, write_document


def nice_here() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def on_a_thread(body) -> dict:
    seen = {}
    thread = threading.Thread(target=body, args=(seen,))
    thread.start()
    thread.join()
    return seen


def test_a_lowered_thread_and_what_it_starts_run_at_the_lower_priority_and_the_others_do_not():
    base = nice_here()

    def lowered(seen: dict) -> None:
        seen["before"] = off_click_path()
        lower_this_thread()
        lower_this_thread(OFF_CLICK_PATH_NICE - 1)  # lowering never raises
        seen["lowered"], seen["off_click_path"] = nice_here(), off_click_path()
        seen.update(on_a_thread(lambda child: child.update(child=nice_here(), child_off_click_path=off_click_path())))

    expected = max(base, OFF_CLICK_PATH_NICE)
    assert on_a_thread(lowered) == {"before": False, "lowered": expected, "off_click_path": expected > NORMAL_NICE,
                                    "child": expected, "child_off_click_path": expected > NORMAL_NICE}
    assert nice_here() == base and not off_click_path()


@pytest.mark.skipif(not task_priority.raising_permitted(), reason="this user cannot raise a thread's priority back")
def test_a_thread_is_raised_back_to_the_normal_priority_and_never_above_it():
    def raised(seen: dict) -> None:
        set_this_thread(OFF_CLICK_PATH_NICE)
        seen["lowered"] = nice_here()
        set_this_thread(NORMAL_NICE - 5)  # never above the process's normal priority
        seen["raised"], seen["off_click_path"] = nice_here(), off_click_path()

    assert on_a_thread(raised) == {"lowered": OFF_CLICK_PATH_NICE, "raised": NORMAL_NICE, "off_click_path": False}


def clicks_watermark(layout: DataLayout, dc: str, watermark_us: int) -> None:
    path = layout.watermark_file(dc, "click")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_document(path, EventTimeWatermark(watermark_us=watermark_us).as_json())


def test_query_runs_run_lowered_while_their_datacenters_are_live_and_normally_while_one_catches_up(tmp_path):
    layout, now_us = DataLayout(tmp_path), 1_800_000_000_000_000
    # No click run yet: nothing says the clicks are live.
    assert catching_up(layout, "dc1", 60, now_us) and query_run_nice(layout, ["dc1"], 60, now_us) == NORMAL_NICE
    clicks_watermark(layout, "dc1", now_us - 20_000_000)  # 20 s behind the clock: live
    clicks_watermark(layout, "dc2", now_us - 600_000_000)  # back from a 10-minute outage
    assert not catching_up(layout, "dc1", 60, now_us) and catching_up(layout, "dc2", 60, now_us)
    assert query_run_nice(layout, ["dc1"], 60, now_us) == OFF_CLICK_PATH_NICE
    assert query_run_nice(layout, ["dc2"], 60, now_us) == NORMAL_NICE
    assert query_run_nice(layout, ["dc1", "dc2"], 60, now_us) == NORMAL_NICE  # one `photon run` for both
    assert query_run_nice(layout, ["dc2"], 900, now_us) == OFF_CLICK_PATH_NICE  # a larger lag allowed
