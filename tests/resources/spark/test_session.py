"""The settings of the JVM that runs the pipeline reach it the same way in both Spark modes."""

from resources.spark import class_archive
from resources.spark.connect_server import server_command
from resources.spark.session import ARROW_OPTIONS, COLLECTOR, HEAP_FREE_OPTIONS, JIT_OPTIONS, JVM_OPTIONS_ENV, local_conf
from resources.spark.task_priority import priority_options

DEFAULTS = " ".join([COLLECTOR, *HEAP_FREE_OPTIONS, *JIT_OPTIONS, *ARROW_OPTIONS, *priority_options()])


def test_jvm_options_from_the_environment_reach_the_driver_and_executors_in_both_modes(tmp_path, monkeypatch):
    """Both modes' JVMs get the serial collector, its free-heap bounds, the JIT's thresholds and Arrow's
    unchecked access, each unless the options say otherwise."""
    monkeypatch.setattr(class_archive, "ARCHIVE_DIR", tmp_path)  # no class archive (test_class_archive.py)
    monkeypatch.delenv(JVM_OPTIONS_ENV, raising=False)
    assert local_conf()["spark.driver.extraJavaOptions"] == DEFAULTS
    assert f"spark.driver.extraJavaOptions={DEFAULTS}" in server_command(15002)

    monkeypatch.setenv(JVM_OPTIONS_ENV, "-XX:TieredStopAtLevel=1")
    arrow = " ".join([COLLECTOR, *HEAP_FREE_OPTIONS, *ARROW_OPTIONS, *priority_options()])
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        assert local_conf()[key] == f"{arrow} -XX:TieredStopAtLevel=1"
        assert f"{key}={arrow} -XX:TieredStopAtLevel=1" in server_command(15002)

    monkeypatch.setenv(JVM_OPTIONS_ENV, "-XX:+UseG1GC -XX:MaxGCPauseMillis=50 -Darrow.enable_unsafe_memory_access=false")
    assert (f"spark.driver.extraJavaOptions={' '.join([*HEAP_FREE_OPTIONS, *JIT_OPTIONS, *priority_options()])} -XX:+UseG1GC "
            "-XX:MaxGCPauseMillis=50 -Darrow.enable_unsafe_memory_access=false") in server_command(15002)

    monkeypatch.setenv(JVM_OPTIONS_ENV, "-XX:MaxHeapFreeRatio=70")  # the heap's bounds, the user's
    assert local_conf()["spark.driver.extraJavaOptions"] == " ".join(
        [COLLECTOR, *JIT_OPTIONS, *ARROW_OPTIONS, *priority_options(), "-XX:MaxHeapFreeRatio=70"])


def test_both_modes_schedule_the_default_pool_fair():
    """A Connect client cannot pick a pool, so every run's jobs share the default pool, and FAIR inside
    it is what lets a click run's jobs take the next free core beside another run's big job."""
    import xml.etree.ElementTree as ET

    for conf in (local_conf(), dict(arg.split("=", 1) for arg in server_command(15002) if "=" in arg and arg.startswith("spark."))):
        assert conf["spark.scheduler.mode"] == "FAIR"
        pools = ET.parse(conf["spark.scheduler.allocation.file"]).getroot()
        [default] = [pool for pool in pools.iter("pool") if pool.get("name") == "default"]
        assert default.findtext("schedulingMode") == "FAIR"
