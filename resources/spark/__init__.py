"""Spark and its JVM, in one place: the session each mode gets (`session.py`: `SparkResource`, a
local session or a Spark Connect client), the Connect server and its driver program
(`connect_server.py`, `connect_driver.py`), the JVM's class archive and the project's two Java
classes (`class_archive.py`, `jvm_build.py`, `jvm/`: Delta's log store in `log_store.py`, the task
priority plugin in `task_priority.py`) and the scheduler's pools (`spark_pools.xml`).

It sits above `resources/runtime/` (process helpers: priority, process groups, forking) and
`resources/state/` (paths), and below the registry and the Dagster resources."""
