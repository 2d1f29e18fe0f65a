"""Each stream's event-time watermark (resources/state/watermark.py), moved by every pass of a run
(spark_ops/ingest.py: pass_watermark) and shown on the asset the pass materializes."""

import time

import dagster as dg

from resources.state.sidecars import EventTimeWatermark


def watermark_metadata(mark: EventTimeWatermark) -> dict:
    """Plotted by the UI: how far the watermark lags the wall clock, and the share of the
    pass's events at or after the watermark that held when it came (Facebook §5.3's accuracy)."""
    return {
        "watermark_us": dg.IntMetadataValue(mark.watermark_us),
        "watermark_lag_seconds": dg.FloatMetadataValue(mark.lag_seconds(time.time_ns() // 1000)),
        "watermark_accuracy": dg.FloatMetadataValue(mark.last_accuracy),
        "watermark_window_passes": dg.IntMetadataValue(mark.window_passes),
    }
