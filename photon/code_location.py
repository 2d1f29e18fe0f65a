"""The Dagster code location: assets, checks, jobs, sensors and resources, assembled.

`definitions.py` (the module `workspace.yaml` and `photon run` load) builds it from the environment:
the data directory comes from PHOTON_DATA_DIR (default ./data); one set of dispatchers is built per
datacenter replica found under its logs/ (or listed in PHOTON_DATACENTERS).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import dagster as dg

from photon_assets import bookkeeping
from photon_assets.checks import ALL_CHECKS
from photon_assets.clicks import click_aggregates, join_clicks
from photon_assets.freshness import with_freshness
from photon_assets.jobs import check_tables_job, ingest_queries_job, join_clicks_job, refresh_aggregates_job, verify_job
from photon_assets.maintenance import maintain_tables_job
from photon_assets.queries import ingest_query_logs
from photon_assets.recovery import recover_lost_clicks_job
from resources.id_registry import registry_resource_from_env
from resources.settings import pipeline_settings
from resources.spark.session import spark_resource_from_env
from resources.state.layout import DATA_DIR_ENV, DataLayout
from resources.storage import WarehouseResource
from sensors.alerts import alert_sensor
from sensors.deps import SensorDeps
from sensors.dispatcher import log_dispatcher, pending_dispatcher, ticked_by_daemon
from sensors.upkeep import aggregates_refresher, table_checker, table_maintainer


def build_definitions(data_dir: str, datacenters: list[str] | None = None) -> dg.Definitions:
    """The code location over `data_dir`, with dispatchers for `datacenters` (default: those of
    PHOTON_DATACENTERS, else every replica directory under the data directory's logs/)."""
    if datacenters is None:
        datacenters = DataLayout(Path(data_dir).resolve()).datacenters()
    settings = pipeline_settings()
    deps = SensorDeps(settings, registry_resource_from_env(data_dir, resolved=True).get,
                      ticked_by_daemon=ticked_by_daemon(), started_at=time.time())
    return dg.Definitions(
        # The implicit asset job's runs (Materialize in the UI, `dg launch`) too: a process per step (Dagster's
        # default, multiprocess) cost them ~5 s of start each.
        executor=dg.in_process_executor,
        assets=with_freshness([ingest_query_logs, join_clicks, click_aggregates, *bookkeeping.SPECS],
                              settings.joined_clicks_fresh_within_seconds),
        asset_checks=ALL_CHECKS,
        jobs=[ingest_queries_job, join_clicks_job, refresh_aggregates_job, check_tables_job, verify_job,
              recover_lost_clicks_job, maintain_tables_job],
        sensors=[
            *[
                sensor
                for dc in datacenters
                for sensor in (log_dispatcher(dc, "query", data_dir, deps), log_dispatcher(dc, "click", data_dir, deps),
                               pending_dispatcher(dc, data_dir, deps))
            ],
            aggregates_refresher(data_dir, deps),
            table_checker(data_dir, deps),
            table_maintainer(data_dir, deps),
            alert_sensor(data_dir, deps),
        ],
        resources={
            "spark": spark_resource_from_env(),
            "warehouse": WarehouseResource(data_dir=data_dir),
            "registry": registry_resource_from_env(data_dir),
            "settings": settings,
        },
    )


def definitions_from_env() -> dg.Definitions:
    """The code location of this deployment: the data directory of PHOTON_DATA_DIR (default ./data)."""
    return build_definitions(os.environ.get(DATA_DIR_ENV, "data"))
