"""The CPU priority of the work off the click path (resources/runtime/priority.py): a thread lowered
alone, the threads it starts inheriting it, and never raised again."""

import os
import threading

from resources.runtime.priority import OFF_CLICK_PATH_NICE, lower_this_thread


def test_a_lowered_thread_and_what_it_starts_run_at_the_lower_priority_and_the_others_do_not():
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen = {}

    def started_by_it() -> None:
        seen["child"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def lowered() -> None:
        lower_this_thread()
        lower_this_thread(OFF_CLICK_PATH_NICE - 1)  # never raised
        seen["lowered"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        child = threading.Thread(target=started_by_it)
        child.start()
        child.join()

    thread = threading.Thread(target=lowered)
    thread.start()
    thread.join()
    expected = max(base, OFF_CLICK_PATH_NICE)
    assert seen == {"lowered": expected, "child": expected}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base
