"""The sensor that evaluates the freshness check of joined_clicks (photon_assets/checks.py) under
the daemon, so that the asset and the Automation page show when the pipeline stopped joining.
Like the dispatchers it runs by default under `photon up`; `photon run` does not start it (its runs
would keep a drain from ever being idle, and a finished drain is fresh by definition)."""

import warnings

import dagster as dg

from sensors.dispatcher import default_status

FRESHNESS_SENSOR = "joined_clicks_freshness_sensor"


def freshness_sensor(checks: list[dg.AssetChecksDefinition]) -> dg.SensorDefinition:
    with warnings.catch_warnings():  # superseded by FreshnessPolicy: see joined_clicks_freshness
        warnings.simplefilter("ignore", dg.SupersessionWarning)
        return dg.build_sensor_for_freshness_checks(
            freshness_checks=checks, name=FRESHNESS_SENSOR, default_status=default_status(),
        )
