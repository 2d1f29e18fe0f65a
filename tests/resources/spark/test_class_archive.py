"""The JVM class archive: added to the pipeline's JVMs when setup made it, and mapped by them."""

import os
from pathlib import Path

from resources.spark import class_archive
from resources.spark.class_archive import archive_options, archive_path
from resources.spark.connect_server import server_command
from resources.spark.session import ARROW_OPTIONS, COLLECTOR, HEAP_FREE_OPTIONS, JIT_OPTIONS, JVM_OPTIONS_ENV, local_conf
from resources.spark.task_priority import priority_options
from tests.conftest import java_descendants

DEFAULTS = " ".join([*HEAP_FREE_OPTIONS, *JIT_OPTIONS, *ARROW_OPTIONS, *priority_options()])


def test_the_archive_reaches_both_modes_only_when_it_exists_and_sharing_is_not_decided_already(tmp_path, monkeypatch):
    monkeypatch.setattr(class_archive, "ARCHIVE_DIR", tmp_path)
    monkeypatch.delenv(JVM_OPTIONS_ENV, raising=False)
    assert archive_options("") == []
    assert local_conf()["spark.driver.extraJavaOptions"] == f"{COLLECTOR} {DEFAULTS}"

    archive_path().write_bytes(b"")
    option = " ".join(archive_options(""))
    assert f"-XX:SharedArchiveFile={tmp_path / archive_path().name}" in option
    assert local_conf()["spark.driver.extraJavaOptions"] == f"{COLLECTOR} {DEFAULTS} {option}"
    assert f"spark.driver.extraJavaOptions={COLLECTOR} {DEFAULTS} {option}" in server_command(15002)

    monkeypatch.setenv(JVM_OPTIONS_ENV, "-XX:+UseG1GC")  # the user's collector replaces the default one
    assert local_conf()["spark.driver.extraJavaOptions"] == f"{DEFAULTS} -XX:+UseG1GC {option}"
    # The user's own choice of sharing wins, and the training run's dump never maps an archive.
    for decided in ("-Xshare:off", "-XX:SharedArchiveFile=/elsewhere.jsa", "-XX:ArchiveClassesAtExit=/new.jsa"):
        assert archive_options(decided) == []
    monkeypatch.setenv(JVM_OPTIONS_ENV, "-Xshare:off")
    assert local_conf()["spark.driver.extraJavaOptions"] == f"{COLLECTOR} {DEFAULTS} -Xshare:off"


def test_the_archive_is_named_after_the_java_pyspark_and_jars_it_was_made_with(tmp_path, monkeypatch):
    jars = tmp_path / "jars"
    jars.mkdir()
    monkeypatch.setattr(class_archive, "JARS_DIR", jars)
    class_archive.fingerprint.cache_clear()
    try:
        before = archive_path().name
        (jars / "delta-spark_2.13-9.9.9.jar").write_bytes(b"")
        class_archive.fingerprint.cache_clear()
        assert archive_path().name != before
    finally:
        class_archive.fingerprint.cache_clear()


def test_the_suites_jvm_maps_the_archive_setup_made(spark):
    path = archive_path()
    assert path.is_file(), f"scripts/setup.sh made no class archive {path} (its log: {path.parent / 'training.log'})"
    # The local session's JVM, and any Connect server an earlier test of this worker started (not the
    # JVMs of a standalone cluster, which Photon's options do not reach).
    told = f"-XX:SharedArchiveFile={path}".encode()
    jvms = [jvm for jvm in java_descendants(os.getpid()) if told in (Path("/proc") / str(jvm) / "cmdline").read_bytes()]
    assert jvms, "no JVM of this test process was started with the archive"
    for jvm in jvms:
        # A JVM unmaps an archive that does not match it (its build, its class path) and loads from the jars.
        assert str(path) in (Path("/proc") / str(jvm) / "maps").read_text(), f"JVM {jvm} did not map {path}"
