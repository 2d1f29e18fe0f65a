"""The daemon that forks Spark's Python workers for this project's sessions (`spark.python.daemon.module`,
resources/spark/session.py): pyspark's own daemon, started with two changes measured on click runs.

- A worker calls `importlib.invalidate_caches()` before every task, which re-reads the directory of
  every archive it imports from: the `spark-core` jar Spark puts on the path (5,261 entries, no
  Python in it) and `pyspark.zip`, once per pyspark package imported from it. That cost 0.1-0.15 s
  a task, and a click run runs dozens of Python tasks. So the jar leaves the path, and so do
  pyspark's own archives where the same pyspark is installed as files (pip, this project's
  setup): a directory's cache reset costs microseconds.
- Every forked worker imported the modules our tasks use on its first task (~0.8 s and ~130 MB
  each, ~1.8 s while `dagster` came with them). Imported here once, before the forks, a worker
  starts with them and shares their memory with its siblings (frozen for the garbage collector, so
  that it keeps sharing them).
"""

import sys
from importlib.machinery import PathFinder
from pathlib import Path


def _leave_path(paths: list[str]) -> None:
    sys.path[:] = [p for p in sys.path if p not in paths]
    for path in paths:
        sys.path_importer_cache.pop(path, None)


def _pyspark_archive(path: str) -> bool:
    name = Path(path).name
    return name == "pyspark.zip" or (name.startswith("py4j-") and name.endswith(".zip"))


if __name__ == "__main__":
    _leave_path([p for p in sys.path if p.endswith(".jar")])
    archives = [p for p in sys.path if _pyspark_archive(p)]
    rest = [p for p in sys.path if p not in archives]
    if PathFinder.find_spec("pyspark", rest) and PathFinder.find_spec("py4j", rest):
        _leave_path(archives)

    import pyarrow.compute  # noqa: F401
    import pyspark.worker  # noqa: F401

    import spark_ops.parse  # noqa: F401
    import spark_ops.registry_calls  # noqa: F401
    from pyspark import daemon

    from resources.runtime.forking import freeze_before_fork

    freeze_before_fork()
    daemon.manager()
