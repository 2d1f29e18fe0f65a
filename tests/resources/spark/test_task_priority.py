"""The Spark tasks of the work off the click path run at its lower CPU priority (resources/spark/task_priority.py):
a thread that was lowered tags its Spark operations, and the JVM's plugin runs their tasks lowered and
sets each task's thread back when it ends; where priorities cannot be set back, nothing is loaded."""

import glob
import os
import threading
import time

import pytest

from resources.spark import task_priority
from resources.runtime.priority import OFF_CLICK_PATH_NICE, lower_this_thread
from resources.spark.session import SparkResource, local_conf
from tests.conftest import java_descendants


def this_process_jvm() -> int:
    """The local session's JVM: the java under this process that runs as pyspark's gateway. Not any
    java under it: the shared Spark Connect server of the tests that opt in (conftest) is one too, when
    this test runs in the same worker after them (`photon spark-connect` execs its java)."""
    for jvm in java_descendants(os.getpid()):
        if open(f"/proc/{jvm}/cmdline").read().split("\0")[-2:] == ["pyspark-shell", ""]:
            return jvm
    raise AssertionError("no pyspark gateway JVM under this process")


def executor_threads_nice(jvm: int) -> dict[str, int]:
    nice = {}
    for task in glob.glob(f"/proc/{jvm}/task/*"):
        try:
            if open(f"{task}/comm").read().startswith("Executor task"):
                stat = open(f"{task}/stat").read()
                nice[task.rsplit("/", 1)[1]] = int(stat[stat.rindex(")") + 2:].split()[16])
        except OSError:
            continue
    return nice


@pytest.mark.skipif(not task_priority.raising_permitted(), reason="this user cannot set a thread's priority back")
def test_the_tasks_of_work_off_the_click_path_run_lowered_and_their_threads_are_set_back(spark):
    spark.range(1).collect()  # executor threads exist
    jvm = this_process_jvm()
    seen = {}

    def slow(batches):  # defined here: pickled by value (this module is not on the workers' path)
        import time as clock

        for batch in batches:
            clock.sleep(3)
            yield batch

    def run(lowered: bool) -> None:
        if lowered:
            lower_this_thread()
        session = SparkResource.local().session()
        seen[lowered, "tagged"] = task_priority.OFF_CLICK_PATH_TAG in session.getTags()
        session.range(2, numPartitions=2).mapInArrow(slow, "id long").collect()

    for lowered in (True, False):
        thread = threading.Thread(target=run, args=(lowered,))
        thread.start()
        time.sleep(1.5)  # into the tasks (3 s each)
        deadline = time.monotonic() + 60
        # Until the tasks run (a cold session's first job, or a loaded machine, takes longer than 1.5 s).
        not_yet = [set(), {0}] if lowered else [set()]
        while set(executor_threads_nice(jvm).values()) in not_yet:
            assert time.monotonic() < deadline, executor_threads_nice(jvm)
            time.sleep(0.2)
        seen[lowered, "during"] = sorted(set(executor_threads_nice(jvm).values()))
        thread.join()
        seen[lowered, "after"] = sorted(set(executor_threads_nice(jvm).values()))
    assert seen == {(True, "tagged"): True, (True, "during"): [OFF_CLICK_PATH_NICE], (True, "after"): [0],
                    (False, "tagged"): False, (False, "during"): [0], (False, "after"): [0]}


def test_the_plugin_and_its_jvm_options_are_there_only_where_priorities_can_be_set_back(monkeypatch):
    for permitted in (True, False):
        monkeypatch.setattr(task_priority, "raising_permitted", lambda: permitted)
        conf = local_conf()
        assert ("spark.plugins" in conf) == permitted
        assert all((option in conf["spark.driver.extraJavaOptions"]) == permitted
                   for option in task_priority.PRIORITY_OPTIONS)
        assert str(task_priority.plugin_jar()) in conf["spark.jars"]
