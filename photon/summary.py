"""The counts `photon run` reports (docs/CONTRACTS.md: command line), read from the tables (by DuckDB over
the deltalake reader, and the Delta log's row counts: no Spark job) and the last verification."""

import time

import dagster as dg

from photon_assets.work_unit import work_units_failed_for_good
from resources.spark.session import spark_session
from resources.state.layout import TABLES, DataLayout
from resources.state.sidecars import EventTimeWatermark
from spark_ops.join import CAPPED_REASON, EVENT_STORE_COUNTS
from spark_ops.tables import delta_rows, duckdb_over, one_row, row_count


def summarize(layout: DataLayout, datacenters: list[str], instance: dg.DagsterInstance,
              clicks_pending: int | None) -> dict:
    """Lines and clicks are counted over every datacenter, each log line once by its file and offset
    (replicas hold the same bytes, and each datacenter reads only its share: resources/registry/ownership.py);
    queries ingested, runs and their costs are this process's datacenters'. `clicks_pending`: as the
    last verification counted them (photon/verify.py: pending_clicks)."""
    spark = spark_session()
    tables = {name: layout.table(name) for name in TABLES}
    read = ("click_ledger", "unjoinable_clicks", "quarantined_lines")
    with duckdb_over({name: delta_rows(name, tables[name]) for name in read}) as con:
        # Lines and distinct clicks from one read: another datacenter's pipeline may still be appending.
        lines = one_row(con, 'SELECT count(DISTINCT (file, "offset")) AS seen, count(DISTINCT click_id) AS ids '
                             'FROM click_ledger')
        by_reason = dict(con.sql("SELECT reason, count(*) FROM unjoinable_clicks GROUP BY reason").fetchall())
        quarantined = one_row(con, 'SELECT count(DISTINCT (stream, file, "offset")) AS lines FROM quarantined_lines')
    seen, distinct_clicks = lines["seen"], lines["ids"]
    return {
        "clicks_seen": seen,
        "distinct_clicks": distinct_clicks,
        "clicks_joined": row_count(spark, "joined_clicks", tables["joined_clicks"]),
        "clicks_pending": clicks_pending,
        "clicks_unjoinable": sum(by_reason.values()),
        "unjoinable_by_reason": by_reason,
        "clicks_capped": by_reason.get(CAPPED_REASON, 0),
        "duplicate_click_lines": seen - distinct_clicks,
        "quarantined_lines": quarantined["lines"],
        "queries_ingested": row_count(spark, "query_logs", tables["query_logs"], partitions={"dc": datacenters}),
        "datacenters": datacenters,
        "watermarks": watermarks(layout, datacenters),
        "failed_work_units": sorted(work_units_failed_for_good(instance)),
        **materialization_totals(instance, datacenters),
        "run_cost": run_costs(instance, datacenters),
    }


def watermarks(layout: DataLayout, datacenters: list[str]) -> dict:
    """Per datacenter and stream: the event-time watermark, its lag behind the wall clock, and its
    accuracy over every pass so far (resources/state/watermark.py)."""
    now_us = time.time_ns() // 1000
    marks = {dc: {stream: EventTimeWatermark.load(layout.watermark_file(dc, stream)) for stream in ("query", "click")}
             for dc in datacenters}
    return {dc: {stream: {"watermark_us": mark.watermark_us, "lag_seconds": mark.lag_seconds(now_us),
                          "accuracy": mark.accuracy, "window_passes": mark.window_passes}
                 for stream, mark in by_stream.items()}
            for dc, by_stream in marks.items()}



# Per datacenter: clicks looked up, skipped because another work unit had registered them (the
# dispatcher lookup), joined, and wasted joins (joined, then refused by the registry), each summed
# from its joined_clicks metadata key.
JOINER_METADATA = {"clicks": "clicks_looked_up", "skipped_registered": "clicks_skipped_registered",
                   "joined": "clicks_joined", "refused": "clicks_refused"}


def materialization_totals(instance: dg.DagsterInstance, datacenters: list[str]) -> dict:
    """Totals over every click run so far, from the joined_clicks materializations: query lookups by
    the EventStore tier that served them, and the joiner's counts per datacenter."""
    totals = dict.fromkeys(EVENT_STORE_COUNTS, 0)
    per_dc = {dc: dict.fromkeys(JOINER_METADATA, 0) for dc in datacenters}
    cursor = None
    while True:
        page = instance.fetch_materializations(dg.AssetKey("joined_clicks"), limit=1000, cursor=cursor)
        for record in page.records:
            metadata = record.asset_materialization.metadata
            for key in EVENT_STORE_COUNTS:
                value = metadata.get(f"eventstore_{key}")
                totals[key] += value.value if value is not None else 0
            dc = metadata.get("dc")
            if dc is not None and dc.value in per_dc:
                for key, label in JOINER_METADATA.items():
                    value = metadata.get(label)
                    per_dc[dc.value][key] += value.value if value is not None else 0
        if not page.has_more:
            break
        cursor = page.cursor
    found = totals["memory_hits"] + totals["durable_hits"] + totals["logs_hits"]
    lookups = found + totals["not_found"]
    totals["memory_hit_ratio"] = round(totals["memory_hits"] / lookups, 4) if lookups else None
    totals["logs_bytes_per_lookup"] = round(totals["logs_bytes_read"] / totals["logs_hits"], 1) if totals["logs_hits"] else None
    totals["found_ratio"] = round(found / lookups, 4) if lookups else None
    joined = sum(d["joined"] for d in per_dc.values())
    wasted = sum(d["refused"] for d in per_dc.values())
    return {
        "event_store": totals,
        "joiner_by_dc": per_dc,
        # Photon §4: share of events processed by both joiners (joined here, refused by the registry).
        "wasted_join_share": round(wasted / (joined + wasted), 4) if joined + wasted else None,
    }


# The asset of each kind of run whose materialization carries that run's cost (photon_assets/).
COST_ASSETS = {"query": "query_logs", "click": "joined_clicks", "aggregates": "click_aggregates"}


def upper_median(values: list[float]) -> float | None:
    return round(sorted(values)[len(values) // 2], 3) if values else None


def run_costs(instance: dg.DagsterInstance, datacenters: list[str]) -> dict:
    """Per kind of run, over these datacenters' runs (and the aggregates refreshes) so far: how many, their Spark jobs (counted in
    local mode only: None over Spark Connect) and Delta commits (totals and per run), their median wall
    time, the time of each phase in all, and the median time from a run's creation to its first Spark
    call after its launch (its fixed cost before any work)."""
    costs = {}
    for kind, asset in COST_ASSETS.items():
        runs, jobs, commits, seconds, phases, launches = 0, None, 0, [], {}, []
        cursor = None
        while True:
            page = instance.fetch_materializations(dg.AssetKey(asset), limit=1000, cursor=cursor)
            for record in page.records:
                metadata = {k: v.value for k, v in record.asset_materialization.metadata.items()}
                # Aggregates refreshes serve every datacenter (sensors/upkeep.py): they carry none.
                if metadata.get("dc", datacenters[0]) not in datacenters or "delta_commits" not in metadata:
                    continue
                runs += 1
                if "spark_jobs" in metadata:
                    jobs = (jobs or 0) + metadata["spark_jobs"]
                commits += metadata["delta_commits"]
                own = {k[len("phase_"):-len("_seconds")]: v for k, v in metadata.items()
                       if k.startswith("phase_") and k.endswith("_seconds")}
                seconds.append(sum(own.values()))
                if "launch_to_spark_seconds" in metadata:
                    launches.append(metadata["launch_to_spark_seconds"])
                for name, value in own.items():
                    phases[name] = round(phases.get(name, 0.0) + value, 3)
            if not page.has_more:
                break
            cursor = page.cursor
        costs[kind] = {
            "runs": runs,
            "spark_jobs": jobs,
            "delta_commits": commits,
            "spark_jobs_per_run": round(jobs / runs, 1) if runs and jobs is not None else None,
            "delta_commits_per_run": round(commits / runs, 2) if runs else None,
            "median_seconds": upper_median(seconds),
            "phase_seconds": phases,
            "median_launch_to_spark_seconds": upper_median(launches),
        }
    return costs
