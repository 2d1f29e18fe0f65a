"""The instance's storage (photon/sqlite_storage.py): Dagster's SQLite files, one engine per database and
process, a connection per call (so a forked run process writes through its own)."""

import multiprocessing

import dagster as dg
from sqlalchemy import event
from sqlalchemy.engine import Engine

from photon.dagster_internals import instance_at
from photon.deployment import instance_yaml
from photon.sqlite_storage import KeptEngineSqliteStorage, engines_kept


@dg.asset
def counted() -> dg.MaterializeResult:
    return dg.MaterializeResult(metadata={"dagster/row_count": 1})


def kept_for(home) -> dict:
    return {key: engine for key, engine in engines_kept().items() if str(home) in key}


def materialized(instance: dg.DagsterInstance) -> int:
    return len(instance.fetch_materializations(dg.AssetKey("counted"), limit=100).records)


def test_the_instance_keeps_one_engine_per_database_across_runs(tmp_path):
    (tmp_path / "dagster.yaml").write_text(instance_yaml(tmp_path, tmp_path / "run.sock"))
    instance = instance_at(tmp_path)
    assert instance.get_ref().storage_data.class_name == KeptEngineSqliteStorage.__name__
    first = dg.materialize([counted], instance=instance)
    engines = kept_for(tmp_path)
    # runs.db, schedules.db, the event log's index and the run's own database
    assert {key.rsplit("/", 1)[1] for key in engines} >= {"runs.db", "index.db", f"{first.run_id}.db"}
    second = dg.materialize([counted], instance=instance)
    assert second.success and instance.get_runs_count() == 2 and materialized(instance) == 2
    kept = kept_for(tmp_path)
    assert all(kept[key] is engine for key, engine in engines.items() if key in kept)


def test_an_instance_dagster_made_opens_with_kept_engines_and_the_other_way_round(tmp_path):
    made_by_dagster = instance_at(tmp_path)  # no dagster.yaml: Dagster's own SQLite storage
    dg.materialize([counted], instance=made_by_dagster)
    (tmp_path / "dagster.yaml").write_text(instance_yaml(tmp_path, tmp_path / "run.sock"))
    ours = instance_at(tmp_path)
    dg.materialize([counted], instance=ours)
    assert ours.get_runs_count() == 2 and materialized(ours) == 2
    (tmp_path / "dagster.yaml").unlink()
    assert materialized(instance_at(tmp_path)) == 2


def _materialize_on_the_inherited_instance() -> None:
    raise SystemExit(0 if dg.materialize([counted], instance=_inherited["instance"]).success else 1)


_inherited: dict = {}


def test_a_forked_process_writes_through_its_own_connections(tmp_path):
    """photon up's run server forks each run from a process that used the instance already."""
    (tmp_path / "dagster.yaml").write_text(instance_yaml(tmp_path, tmp_path / "run.sock"))
    instance = instance_at(tmp_path)
    dg.materialize([counted], instance=instance)
    _inherited["instance"] = instance
    fork = multiprocessing.get_context("fork")
    children = [fork.Process(target=_materialize_on_the_inherited_instance) for _ in range(2)]
    for child in children:
        child.start()
    dg.materialize([counted], instance=instance)  # the parent writes meanwhile
    for child in children:
        child.join(60)
        assert child.exitcode == 0
    assert instance.get_runs_count() == 4 and materialized(instance) == 4


def statements_of(ask) -> list[str]:
    """The SQL statements `ask()` sent to any database."""
    sent = []

    def record(conn, cursor, statement, *args):
        sent.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        ask()
    finally:
        event.remove(Engine, "before_cursor_execute", record)
    return sent


def test_schema_questions_answered_yes_are_not_asked_again_and_a_no_is(tmp_path):
    (tmp_path / "dagster.yaml").write_text(instance_yaml(tmp_path, tmp_path / "run.sock"))
    dg.materialize([counted], instance=instance_at(tmp_path))
    instance = instance_at(tmp_path)  # its storages have asked nothing yet
    schedules, events = instance.schedule_storage, instance.event_log_storage
    for ask in (schedules.has_instigators_table, lambda: events.has_table("asset_keys")):
        assert statements_of(ask) and ask()
        assert statements_of(ask) == []

    def never_built():
        return schedules.has_built_index("no_such_migration")

    assert statements_of(never_built) and statements_of(never_built) and not never_built()
    # Reading the sensors' states, as every tick does: after the first, the states alone are read.
    schedules.all_instigator_state()
    sent = statements_of(schedules.all_instigator_state)
    assert sent and not any("sqlite_master" in statement or "secondary_indexes" in statement for statement in sent)


def test_a_runs_event_database_is_made_as_dagsters_own_storage_makes_it(tmp_path):
    """Its tables, indexes and write-ahead logging are Dagster's, stamped at alembic's head, which
    Dagster's own revision check accepts (alembic's scripts read once per process, not per run)."""
    import sqlite3

    from dagster._core.storage.event_log.sqlite import sqlite_event_log
    from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
    from dagster._core.storage.sql import check_alembic_revision, get_alembic_config

    from photon.sqlite_storage import KeptEngineEventLogStorage, kept_engine

    def made(path):
        with sqlite3.connect(path) as conn:
            return (sorted(conn.execute("SELECT type, name, sql FROM sqlite_master").fetchall(), key=str),
                    conn.execute("PRAGMA journal_mode").fetchall())

    (tmp_path / "ours").mkdir(), (tmp_path / "dagsters").mkdir()
    ours = KeptEngineEventLogStorage(str(tmp_path / "ours"))
    with ours._connect("run1"):
        pass
    with SqliteEventLogStorage(str(tmp_path / "dagsters"))._connect("run1"):
        pass
    assert made(tmp_path / "ours" / "run1.db") == made(tmp_path / "dagsters" / "run1.db")
    with kept_engine(ours.conn_string_for_shard("run1")).connect() as conn:
        db_revision, head = check_alembic_revision(get_alembic_config(sqlite_event_log.__file__), conn)
    assert db_revision == head is not None
