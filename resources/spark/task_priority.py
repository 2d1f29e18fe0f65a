"""The Spark tasks of the work kept off the click path, at a lower CPU priority (issue 42, item 5).

resources/runtime/priority.py lowers the Python side of that work: `photon run`'s thread of the runs off
the click path, `photon up`'s processes of them. Their Spark work runs in the JVM the click runs share:
a query run's appends to the durable tier, a compaction, a refresh's write. There a plugin,
`photon.spark.OffClickPathPriority` (resources/spark/jvm/OffClickPathPriority.java), gives each task of a job
that carries OFF_CLICK_PATH_TAG (SparkResource tags the operations of a thread or process that was
lowered) the JVM's lowest thread priority while it runs, which Java maps to the nice value
OFF_CLICK_PATH_NICE with `-XX:ThreadPriorityPolicy=1`, and sets it back when the task ends.

Setting it back raises the thread's priority, which Linux allows only with CAP_SYS_NICE (root, or the
capability granted, e.g. systemd's `AmbientCapabilities=CAP_SYS_NICE`): without it the JVM would leave a
pooled thread lowered for the click run that gets it next. So the plugin and the JVM options are on
only where this process can raise a thread's priority (`raising_permitted`); elsewhere the tasks run
at the JVM's priority, as the driver's own work of those jobs always does (their planning and Delta's
commit logic run on the thread that asked, where no hook of Spark's runs).

The class is compiled against Spark's core and Scala's library (pyspark's jars) into
`.cache/jars/photon-task-priority-<hash of the source>.jar` (resources/spark/jvm_build.py).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from pathlib import Path

from pyspark.find_spark_home import _find_spark_home

from resources.spark.class_archive import JARS_DIR
from resources.spark.jvm_build import compiled_jar
from resources.runtime.priority import OFF_CLICK_PATH_NICE

SOURCE = Path(__file__).with_name("jvm") / "OffClickPathPriority.java"
CLASS_NAME = "photon.spark.OffClickPathPriority"
JAR_PREFIX = "photon-task-priority-"
# The Spark tag of the operations off the click path; the plugin's TAG.
OFF_CLICK_PATH_TAG = "photon-off-click-path"
# Java's lowest thread priority (1) as OFF_CLICK_PATH_NICE, the normal one (5) as nice 0, Java's own map.
PRIORITY_OPTIONS = ["-XX:ThreadPriorityPolicy=1", f"-XX:JavaPriority1_To_OSPriority={OFF_CLICK_PATH_NICE}"]


def plugin_jar(jars_dir: Path = JARS_DIR) -> Path:
    """The plugin's jar for the current source, compiled first if missing."""
    spark_jars = Path(_find_spark_home()) / "jars"
    class_path = [*spark_jars.glob("spark-core_*.jar"), *spark_jars.glob("scala-library-*.jar")]
    return compiled_jar(SOURCE, JAR_PREFIX, class_path, jars_dir)


@functools.cache
def raising_permitted() -> bool:
    """Whether this process (and the JVM it starts, with its user and capabilities) may raise a
    thread's priority back: tried on a thread of its own, lowered by one, then set back."""
    answer = []

    def probe() -> None:
        tid = threading.get_native_id()
        base = os.getpriority(os.PRIO_PROCESS, tid)
        try:
            os.setpriority(os.PRIO_PROCESS, tid, base + 1)
            os.setpriority(os.PRIO_PROCESS, tid, base)
            answer.append(True)
        except OSError:
            answer.append(False)

    thread = threading.Thread(target=probe, name="priority-probe")
    thread.start()
    thread.join()
    return answer[0]


def plugin_conf() -> dict[str, str]:
    """The Spark setting that loads the plugin, where it can set priorities back (see the module docstring)."""
    return {"spark.plugins": CLASS_NAME} if raising_permitted() else {}


def priority_options() -> list[str]:
    """The JVM options that map thread priorities to nice values, where the plugin is loaded."""
    return PRIORITY_OPTIONS if raising_permitted() else []


if __name__ == "__main__":  # scripts/setup.sh
    print(f"task priority plugin: {plugin_jar()}", file=sys.stderr)
