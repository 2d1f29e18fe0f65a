"""The counts `photon run` reports (DESIGN.md: command line), read from the tables and registry."""

import shutil

import dagster as dg
from pyspark.sql import functions as F

from photon.layout import TABLES, DataLayout
from resources.registry import registry_resource_from_env
from resources.spark import delta_session
from sensors.retries import work_units_failed_for_good
from spark_ops.handoff import unstage
from spark_ops.tables import read_table


def summarize(layout: DataLayout, datacenters: list[str], instance: dg.DagsterInstance) -> dict:
    spark = delta_session()
    tables = {name: layout.table(name) for name in TABLES}
    in_scope = F.col("dc").isin(datacenters)
    ledger = read_table(spark, "click_ledger", tables["click_ledger"]).where(in_scope).persist()
    staged = layout.staging / "summary"
    shutil.rmtree(staged, ignore_errors=True)
    registered = unstage(spark, registry_resource_from_env(str(layout.root)).get().scan(), staged)
    unjoinable = read_table(spark, "unjoinable_clicks", tables["unjoinable_clicks"])
    try:
        seen = ledger.count()
        per_dc_distinct = ledger.select("dc", "click_id").distinct().count()
        distinct = ledger.select("click_id").distinct()
        summary = {
            "clicks_seen": seen,
            "distinct_clicks": distinct.count(),
            "clicks_joined": read_table(spark, "joined_clicks", tables["joined_clicks"]).count(),
            # Clicks too old for the registry are unjoinable without being registered.
            "clicks_pending": distinct.join(registered, "click_id", "left_anti")
            .join(unjoinable.select("click_id"), "click_id", "left_anti").count(),
            "clicks_unjoinable": unjoinable.count(),
            "duplicate_click_lines": seen - per_dc_distinct,
            "quarantined_lines": read_table(spark, "quarantined_lines", tables["quarantined_lines"]).where(in_scope).count(),
            "queries_ingested": read_table(spark, "query_logs", tables["query_logs"]).where(in_scope).count(),
            "datacenters": datacenters,
            "failed_work_units": sorted(work_units_failed_for_good(instance)),
            "event_store": event_store_totals(instance),
        }
    finally:
        ledger.unpersist()
        shutil.rmtree(staged, ignore_errors=True)
    return summary


EVENT_STORE_KEYS = ("cache_hits", "logs_hits", "not_found", "logs_ranges_read", "logs_bytes_read")


def event_store_totals(instance: dg.DagsterInstance) -> dict:
    """Query lookups of every click run so far, by the EventStore tier that served them."""
    totals = dict.fromkeys(EVENT_STORE_KEYS, 0)
    cursor = None
    while True:
        page = instance.fetch_materializations(dg.AssetKey("joined_clicks"), limit=1000, cursor=cursor)
        for record in page.records:
            metadata = record.asset_materialization.metadata
            for key in EVENT_STORE_KEYS:
                value = metadata.get(f"eventstore_{key}")
                totals[key] += value.value if value is not None else 0
        if not page.has_more:
            break
        cursor = page.cursor
    lookups = totals["cache_hits"] + totals["logs_hits"] + totals["not_found"]
    totals["cache_hit_ratio"] = round(totals["cache_hits"] / lookups, 4) if lookups else None
    found = totals["cache_hits"] + totals["logs_hits"]
    totals["logs_bytes_per_lookup"] = round(totals["logs_bytes_read"] / totals["logs_hits"], 1) if totals["logs_hits"] else None
    totals["found_ratio"] = round(found / lookups, 4) if lookups else None
    return totals
