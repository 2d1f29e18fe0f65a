"""Table maintenance, off the click path: what a pass would otherwise pay for now and then.

Per datacenter: the durable tier's queries older than its retention leave `query_logs`, once its
boundary has passed the oldest one held. A table's small files (a pass appends one or two per table;
small: under resources/spark/session.py's SMALL_FILE_BYTES, which OPTIMIZE alone rewrites, so a compaction
costs what was appended since the last one, not the whole table) are compacted once it holds
`maintenance_compact_at_files` of them, at most
`maintenance_compact_tables_per_run` tables a run, those with the most files first: a run that compacts
every table at once holds a `photon run`'s passes for a minute. `query_logs` is not compacted: its
rows leave it by eviction within `query_cache_retention_seconds`, and compacting it rewrote every
query of the last minutes in one task (~90 MB at 10,000 queries/s: a core for 90 s, the click runs
beside it three times slower; a live `photon up` of 2026-11-27). `pending_clicks` is compacted by
rewriting each datacenter's records down to the current ones (spark_ops/pending.py), the others by
`OPTIMIZE` (and `pending_clicks` too if that left as many files). The files a run removes (evicted or
compacted away) are noted (resources/state/sidecars.py: Removals) and deleted by a `VACUUM` of their
table once no version younger than `query_cache_vacuum_retain_hours` needs them: a run reading an
older snapshot keeps its files. Files removed by retries and recovery go with the table's next such
`VACUUM`. Each command costs seconds even with nothing to do, hence the conditions.
"""

import time

import dagster as dg

from photon_assets.jobs import OFF_CLICK_PATH_TAGS
from resources.event_store.progress import QueryCache, QueryProgress, durable_tier_boundary_us
from resources.settings import PipelineSettings
from resources.spark.session import SMALL_FILE_BYTES, SparkResource
from resources.state.layout import DataLayout
from resources.state.sidecars import Removals
from resources.storage import WarehouseResource
from spark_ops.query_tiers import evict_from_cache
from spark_ops.meter import count_commit, metered
from spark_ops.pending import compact_pending
from spark_ops.tables import compact, files_under, table_committed, vacuum

MAINTENANCE_JOB = "maintain_tables"
# Small files are compacted where the passes add them; click_aggregates is rewritten by its refreshes,
# query_logs by its eviction (the module docstring).
COMPACTED = ("log_file_map", "click_ledger", "joined_clicks", "unjoinable_clicks", "pending_clicks", "quarantined_lines")


def eviction_boundary(layout: DataLayout, settings: PipelineSettings, dc: str, now_us: int) -> int | None:
    """The durable tier's boundary when a datacenter's `query_logs` may hold queries older than it (None:
    no eviction is due)."""
    progress = QueryProgress.load(layout.query_progress_file(dc))
    boundary = durable_tier_boundary_us(progress.max_ts, settings.query_cache_retention_seconds, now_us)
    if boundary is None or not QueryCache.load(layout.query_cache_file(dc)).needs_eviction(boundary):
        return None
    return boundary


def evict_durable_tier(spark, warehouse: WarehouseResource, settings: PipelineSettings, dc: str, now_us: int) -> int:
    """A datacenter's queries older than the durable tier's boundary removed; returns how many."""
    boundary = eviction_boundary(warehouse.layout, settings, dc, now_us)
    if boundary is None:
        return 0
    evicted, oldest_kept = evict_from_cache(spark, warehouse.tables()["query_logs"], dc, boundary)
    QueryCache.scanned(warehouse.layout.query_cache_file(dc), boundary if oldest_kept is None else oldest_kept)
    return evicted


def small_files_held(path: str) -> int:
    """The small data files (those OPTIMIZE rewrites) a table's current version holds."""
    return files_under(path, SMALL_FILE_BYTES) if table_committed(path) else 0


def to_compact(tables: dict[str, str], settings: PipelineSettings) -> list[str]:
    """The tables this run compacts: those holding `maintenance_compact_at_files` small files or more (each
    command costs seconds even with nothing to do), the most files first, at most
    `maintenance_compact_tables_per_run`."""
    files = {name: small_files_held(tables[name]) for name in COMPACTED}
    due = sorted((name for name in COMPACTED if files[name] >= settings.maintenance_compact_at_files),
                 key=lambda name: -files[name])
    return due[:settings.maintenance_compact_tables_per_run]


def maintenance_due(layout: DataLayout, settings: PipelineSettings, now: float) -> list[str]:
    """What a maintenance run would do now, by the conditions it goes by (empty: nothing, and the run
    would cost only its launch): evictions, compactions, VACUUMs. From the sidecars and the tables'
    Delta logs (deltalake): no Spark job."""
    tables = {name: layout.table(name) for name in COMPACTED}
    due = [f"evict {dc}" for dc in layout.datacenters() if eviction_boundary(layout, settings, dc, int(now * 1e6)) is not None]
    due += [f"compact {name}" for name in to_compact(tables, settings)]
    removals = Removals.load(layout.removals_file)
    return due + [f"vacuum {name}" for name in removals.due(settings.query_cache_vacuum_retain_hours, now)]


@dg.op(description="Evict the durable tier's old queries, compact the pending clicks' records, compact small "
       "files and delete unreferenced ones, where a table needs it.")
def maintain(context: dg.OpExecutionContext, spark: SparkResource, warehouse: WarehouseResource,
             settings: PipelineSettings) -> dg.Output[dict]:
    with metered() as meter:
        session = spark.session()
        tables = warehouse.tables()
        now_us = time.time_ns() // 1000
        done: dict = {"queries_evicted": {}, "pending_records": {}, "compacted": [],
                      "compactions_lost_to_a_concurrent_rewrite": [], "vacuumed": []}
        removed_from = set()  # tables this run removed files from
        for dc in warehouse.layout.datacenters():
            done["queries_evicted"][dc] = evict_durable_tier(session, warehouse, settings, dc, now_us)
            if done["queries_evicted"][dc]:
                removed_from.add("query_logs")
        due = to_compact(tables, settings)  # after the eviction, which rewrites files of query_logs
        if "pending_clicks" in due:
            for dc in warehouse.layout.datacenters():
                before, after = compact_pending(session, tables["pending_clicks"], dc)
                done["pending_records"][dc] = {"before": before, "after": after}
                if before:  # rewritten: its files removed
                    removed_from.add("pending_clicks")
        meter.phase("evict_and_compact_pending")
        for name in due:
            path = tables[name]
            # pending_clicks was rewritten to its current records above: OPTIMIZE only if as many files are left.
            if name == "pending_clicks" and small_files_held(path) < settings.maintenance_compact_at_files:
                continue
            removed = compact(session, path)  # without the table's lock: click runs append beside it
            if removed is None:
                done["compactions_lost_to_a_concurrent_rewrite"].append(name)
            elif removed:  # with nothing to compact, Delta commits nothing
                count_commit(name)
                done["compacted"].append(name)
                removed_from.add(name)
        meter.phase("optimize")
        removals_file, retain_hours = warehouse.layout.removals_file, settings.query_cache_vacuum_retain_hours
        removals = Removals.load(removals_file)  # one maintenance run at a time (sensors/upkeep.py)
        for name in sorted(removed_from):
            removals.add(name, time.time())  # after their commits: no earlier than Delta's own time
        removals.save(removals_file)
        for name in removals.due(retain_hours, time.time()):
            began = time.time()
            vacuum(session, tables[name], retain_hours)
            removals.vacuumed(name, retain_hours, began)
            removals.save(removals_file)
            done["vacuumed"].append(name)
        meter.phase("vacuum")
        cost = meter.metadata()
    context.log.info(f"table maintenance: {done}")
    return dg.Output(done, metadata={**{k: dg.JsonMetadataValue(v) for k, v in done.items()}, **cost})


# In process, like every job here: a step subprocess would start a JVM of its own under `photon run`
# (a 2026-11-25 live run: a second JVM, and a pass held for 112 s).
@dg.job(name=MAINTENANCE_JOB, tags={"photon/kind": "maintenance", **OFF_CLICK_PATH_TAGS}, executor_def=dg.in_process_executor,
        description="Table maintenance, off the click path (photon_assets/maintenance.py).")
def maintain_tables_job():
    maintain()
