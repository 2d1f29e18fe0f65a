"""Delta's log store (resources/spark/log_store.py): a version's commit file is made by exactly one writer,
across processes, and the pipeline's sessions use it."""

import subprocess
from pathlib import Path

from pyspark.find_spark_home import _find_spark_home

from resources.spark import log_store
from resources.spark.class_archive import DELTA_STORAGE_JAR, JARS_DIR
from resources.spark.log_store import CLASS_NAME, jar_path, log_store_jar
from resources.spark.session import local_conf
from spark_ops.tables import delta_path

RACE = Path(__file__).with_name("jvm") / "CommitRace.java"
VERSIONS = 2000


def test_two_jvms_committing_the_same_versions_at_once_win_each_version_exactly_once(tmp_path):
    class_path = ":".join([str(log_store_jar()), str(JARS_DIR / DELTA_STORAGE_JAR),
                           str(Path(_find_spark_home()) / "jars" / "*")])
    classes = tmp_path / "classes"
    subprocess.run(["javac", "-nowarn", "-d", str(classes), "-cp", class_path, str(RACE)], check=True)
    log, barrier = tmp_path / "_delta_log", tmp_path / "barrier"
    log.mkdir()
    barrier.mkdir()
    writers = {name: subprocess.Popen(["java", "-cp", f"{classes}:{class_path}", "CommitRace", CLASS_NAME, str(log),
                                       str(barrier), str(VERSIONS), name, other], stdout=subprocess.PIPE, text=True)
               for name, other in (("a", "b"), ("b", "a"))}
    won = {}
    for name, writer in writers.items():
        out, _ = writer.communicate(timeout=120)
        assert writer.returncode == 0
        won[name] = {int(line) for line in out.split()}

    # Each won some versions, none was won twice, and each commit file holds its winner's line: none
    # was replaced by the loser. (Delta's LocalLogStore in their place: 27-88 of 2,000 versions won by
    # both, the first commit replaced by the second, docs/STACK.md.)
    assert won["a"] and won["b"], {name: len(versions) for name, versions in won.items()}
    assert not won["a"] & won["b"]
    assert won["a"] | won["b"] == set(range(VERSIONS))
    for name, versions in won.items():
        for version in versions:
            assert (log / f"{version:020d}.json").read_text() == f"{name}\n"
    assert sorted(p.name for p in log.iterdir() if not p.name.endswith(".json")) == []  # no temporary file left


def test_the_jar_follows_its_source_and_replaces_the_one_before(tmp_path, monkeypatch):
    storage = JARS_DIR / DELTA_STORAGE_JAR  # what the build compiles against
    (tmp_path / storage.name).symlink_to(storage)
    (tmp_path / "photon-log-store-000000000000.jar").write_bytes(b"")  # built from an older source
    jar = log_store_jar(tmp_path)
    assert jar == jar_path(tmp_path) and jar.stat().st_size > 0
    assert sorted(p.name for p in tmp_path.glob("photon-log-store-*.jar")) == [jar.name]

    source = tmp_path / "LinkLogStore.java"
    source.write_text(log_store.SOURCE.read_text() + "\n// changed\n")
    monkeypatch.setattr(log_store, "SOURCE", source)
    assert jar_path(tmp_path) != jar


def test_delta_commits_through_the_log_store(spark, tmp_path):
    assert local_conf()["spark.delta.logStore.file.impl"] == CLASS_NAME
    assert str(jar_path()) in local_conf()["spark.jars"].split(",")
    path = str(tmp_path / "t")
    spark.range(3).write.format("delta").save(path)
    spark.range(3, 5).write.format("delta").mode("append").save(path)
    spark.sql(f"OPTIMIZE {delta_path(path)}").collect()
    assert spark.read.format("delta").load(path).count() == 5
    # The session's log store is ours: it writes no checksum files beside the commits (Hadoop's local
    # file system, which Delta's own store writes through, does: `.00000000000000000000.json.crc`).
    names = sorted(p.name for p in (tmp_path / "t" / "_delta_log").iterdir())
    assert "00000000000000000002.json" in names and not [n for n in names if n.endswith(".json.crc")], names
