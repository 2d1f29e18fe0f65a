"""The counts `photon run` reports (DESIGN.md: command line), read from the tables and registry."""

import shutil

import dagster as dg
from pyspark.sql import functions as F

from photon.layout import TABLES, DataLayout
from resources.registry import embedded_registry
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
    registered = unstage(spark, embedded_registry(layout.registry_dir).scan(), staged)
    try:
        seen = ledger.count()
        per_dc_distinct = ledger.select("dc", "click_id").distinct().count()
        distinct = ledger.select("click_id").distinct()
        summary = {
            "clicks_seen": seen,
            "distinct_clicks": distinct.count(),
            "clicks_joined": read_table(spark, "joined_clicks", tables["joined_clicks"]).count(),
            "clicks_pending": distinct.join(registered, "click_id", "left_anti").count(),
            "clicks_unjoinable": read_table(spark, "unjoinable_clicks", tables["unjoinable_clicks"]).count(),
            "duplicate_click_lines": seen - per_dc_distinct,
            "quarantined_lines": read_table(spark, "quarantined_lines", tables["quarantined_lines"]).where(in_scope).count(),
            "queries_ingested": read_table(spark, "query_logs", tables["query_logs"]).where(in_scope).count(),
            "datacenters": datacenters,
            "failed_work_units": sorted(work_units_failed_for_good(instance)),
        }
    finally:
        ledger.unpersist()
        shutil.rmtree(staged, ignore_errors=True)
    return summary
