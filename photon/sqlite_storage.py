"""The instance's storage: Dagster's SQLite storages, each keeping one SQLAlchemy engine per database.

Dagster's SQLite run, event log and schedule storages build a new engine for every call: SQLAlchemy's
dialect is set up again on its first connection, and every statement is compiled anew (the compiled
statement cache belongs to the engine). That was most of the Python a sensor tick costs: py-spy over 90 s
of a live `photon run` at 1,000 clicks/s (2026-11-28) found 45 s in sensor passes, 36 s of it in
SQLAlchemy (engine creation 6 s, compiling 7 s, first-connection setup and commits 12 s), on the
process whose main thread drives the click runs.

These subclasses keep one engine per database file for the life of the process, with Dagster's own
pooling (NullPool): each call still opens its own SQLite connection and closes it after its
transaction, so nothing open is shared between threads or inherited by a forked run process
(photon/run_server.py); only the engine's dialect and compiled statements are kept. All three wait up
to Dagster's busy timeout (30 s) for a locked database, which Dagster gave its event log only (the
other two had pysqlite's 5 s). Keeping a connection open between calls was tried and made a live
`photon up` slower (docs/STACK.md).

A run's own event database (one file per run) is created with the schema and alembic stamp Dagster's
`_initdb` gives it, but with alembic's revision scripts read once per process: Dagster's reads them
twice for every new run (to find the head revision, then to stamp it), 125 ms of CPU a run on two slow
cores (2026-12-01), a run every two seconds or so in a live pipeline.

They also answer from memory the questions Dagster's storages ask the database about its own schema
(is there a table, a column, a secondary index built?) once the answer was yes: Dagster asks them at
nearly every call, each over a connection of its own (the event log's `has_table` over a new engine
too), and a migration only ever adds what they ask about. An idle `photon up`'s daemon spent ~36 % of
its busy samples in them, four to six per sensor tick (py-spy, 2026-11-29). Dagster keeps some
answers itself (`cached_property`), yes and no alike; these keep a yes only. The files, schema
and migrations are Dagster's (`storage: sqlite` lays them out the same way), so an instance made by
either opens with the other. dagster.yaml names this class (photon/deployment.py: DAGSTER_YAML).
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import dagster._check as check
import sqlalchemy as db
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from dagster._core.storage.event_log.schema import SqlEventLogStorageMetadata
from dagster._core.storage.event_log.sqlite import sqlite_event_log
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster._core.storage.schedules.sqlite.sqlite_schedule_storage import SqliteScheduleStorage
from dagster._core.storage.sql import get_alembic_config, safe_commit
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS
from dagster._core.storage.sqlite_storage import (
    DagsterSqliteStorage,
    _event_logs_directory,
    _runs_directory,
    _schedule_directory,
)
from dagster._serdes import ConfigurableClassData
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import NullPool

# Engines kept: the runs and schedules databases, the event log's index, and the latest runs' own
# event databases (one file per run); the least recently used goes first.
MAX_ENGINES = 64

_engines: OrderedDict[str, Engine] = OrderedDict()
_engines_lock = threading.Lock()


def kept_engine(conn_string: str) -> Engine:
    """The process's engine for one database, made on first use."""
    with _engines_lock:
        engine = _engines.pop(conn_string, None)
        if engine is None:
            engine = create_engine(conn_string, poolclass=NullPool,
                                   connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS})
        _engines[conn_string] = engine
        while len(_engines) > MAX_ENGINES:
            _engines.popitem(last=False)[1].dispose()
        return engine


def engines_kept() -> dict[str, Engine]:
    """The process's kept engines by connection string, least recently used first (a copy)."""
    with _engines_lock:
        return dict(_engines)


@contextmanager
def _transaction(conn_string: str) -> Iterator[Connection]:
    with kept_engine(conn_string).connect() as conn, conn.begin():
        yield conn


class _KeptEngineConnect:
    """`connect` of Dagster's single-database SQLite storages (runs, schedules), through the kept engine."""

    _conn_string: str

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        with _transaction(self._conn_string) as conn:
            yield conn


def kept_once_yes(question: Callable[..., bool]) -> Callable[..., bool]:
    """A storage's question about its schema, answered from memory once the database said yes (the
    module docstring says why); a no is asked again, as a migration in another process may add it."""

    @functools.wraps(question)
    def ask(self, *args) -> bool:
        key = (question.__name__, *args)
        if key in self._schema_yes:
            return True
        answer = question(self, *args)
        if answer:
            self._schema_yes.add(key)
        return answer

    return ask


class _SchemaAnswersKept:
    """The set of schema questions answered yes (`kept_once_yes`), forgotten when the storage is wiped."""

    @functools.cached_property
    def _schema_yes(self) -> set[tuple]:
        return set()

    def wipe(self) -> None:
        super().wipe()
        self._schema_yes.clear()


class KeptEngineRunStorage(_SchemaAnswersKept, _KeptEngineConnect, SqliteRunStorage):
    has_built_index = kept_once_yes(SqliteRunStorage.has_built_index)
    has_run_stats_index_cols = kept_once_yes(SqliteRunStorage.has_run_stats_index_cols)
    has_bulk_actions_selector_cols = kept_once_yes(SqliteRunStorage.has_bulk_actions_selector_cols)
    has_backfill_id_column = kept_once_yes(SqliteRunStorage.has_backfill_id_column)
    has_bulk_action_job_name_column = kept_once_yes(SqliteRunStorage.has_bulk_action_job_name_column)
    has_backfill_tags_table = kept_once_yes(SqliteRunStorage.has_backfill_tags_table)


class KeptEngineScheduleStorage(_SchemaAnswersKept, _KeptEngineConnect, SqliteScheduleStorage):
    has_instigators_table = kept_once_yes(SqliteScheduleStorage.has_instigators_table)
    has_secondary_index_table = kept_once_yes(SqliteScheduleStorage.has_secondary_index_table)
    has_built_index = kept_once_yes(SqliteScheduleStorage.has_built_index)


@functools.cache
def event_log_scripts() -> ScriptDirectory:
    """Alembic's revision scripts of Dagster's SQLite event log, read once per process (their revision
    map is built on first use, under the cache's call)."""
    scripts = ScriptDirectory.from_config(get_alembic_config(sqlite_event_log.__file__))
    scripts.get_current_head()
    return scripts


class KeptEngineEventLogStorage(_SchemaAnswersKept, SqliteEventLogStorage):
    has_table = kept_once_yes(SqliteEventLogStorage.has_table)
    has_secondary_index = kept_once_yes(SqliteEventLogStorage.has_secondary_index)
    has_asset_key_col = kept_once_yes(SqliteEventLogStorage.has_asset_key_col)

    def _initdb(self, engine: Engine, for_index_shard: bool = False) -> None:
        """A run's database as Dagster's `_initdb` makes it (its tables, write-ahead logging, stamped at
        alembic's head) unless it is stamped already; the index shard Dagster's own way (its
        migrations, a revision pinned for databases of older versions)."""
        if for_index_shard:
            return super()._initdb(engine, for_index_shard)
        with engine.connect() as connection:
            context = MigrationContext.configure(connection)
            if context.get_current_revision() is None:
                SqlEventLogStorageMetadata.create_all(engine)
                connection.execute(db.text("PRAGMA journal_mode=WAL;"))
                context.stamp(event_log_scripts(), "head")
                safe_commit(connection)

    @contextmanager
    def _connect(self, shard: str) -> Iterator[Connection]:
        # As Dagster's: one transaction at a time per storage (its event watcher's thread shares it),
        # and each run's database created on its first use in this process.
        with self._db_lock:
            conn_string = self.conn_string_for_shard(check.str_param(shard, "shard"))
            if shard not in self._initialized_dbs:
                self._initdb(kept_engine(conn_string))
                self._initialized_dbs.add(shard)
            with _transaction(conn_string) as conn:
                yield conn


class KeptEngineSqliteStorage(DagsterSqliteStorage):
    """`storage: sqlite` with engines kept (the module docstring says why)."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        self.base_dir = check.str_param(base_dir, "base_dir")
        self._run_storage = KeptEngineRunStorage.from_local(_runs_directory(base_dir))
        self._event_log_storage = KeptEngineEventLogStorage(_event_logs_directory(base_dir))
        self._schedule_storage = KeptEngineScheduleStorage.from_local(_schedule_directory(base_dir))
        self._inst_data = check.opt_inst_param(inst_data, "inst_data", ConfigurableClassData)
        super(DagsterSqliteStorage, self).__init__()

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value) -> KeptEngineSqliteStorage:
        return cls.from_local(inst_data=inst_data, **config_value)
