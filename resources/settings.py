"""Knobs of the pipeline, with the defaults a production deployment starts from."""

from __future__ import annotations

import dagster as dg


class PipelineSettings(dg.ConfigurableResource):
    # Bad input: lines longer than this are quarantined without being parsed.
    max_line_bytes: int = 65536
    # Work units: a click work unit is small so that joined clicks appear soon; query work units
    # can be larger (the primary stream is 10-100x bigger and only feeds the EventStore).
    click_work_unit_bytes: int = 4 << 20
    query_work_unit_bytes: int = 32 << 20
    # Log file map (Photon §3.4.2): an entry every W seconds of event time or M bytes of log.
    log_file_map_every_seconds: int = 10
    log_file_map_every_bytes: int = 1 << 20
    # Adapter (Photon §3.3.1): `module:function` taking and returning a DataFrame of pairs.
    adapter: str = "spark_ops.join:default_adapter"
    # Failed work units are retried with a new run key after base * 2^(attempt-1) seconds.
    retry_backoff_seconds: float = 2.0
    retry_backoff_max_seconds: float = 300.0
    max_attempts: int = 8
