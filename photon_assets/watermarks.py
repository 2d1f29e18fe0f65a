"""Each stream's event-time watermark (resources/state/watermark.py), moved by every pass of a run and shown
on the asset the pass materializes."""

import time

import dagster as dg

from resources.settings import PipelineSettings
from resources.state.sidecars import EventTimeWatermark
from resources.state.watermark import WatermarkRule
from resources.storage import WarehouseResource
from spark_ops.ingest import IngestStats


def pass_watermark(
    warehouse: WarehouseResource, settings: PipelineSettings, dc: str, stream: str, work_unit: str, stats: IngestStats,
) -> EventTimeWatermark:
    """After the pass's writes: its events (none from the future) move the stream's watermark."""
    return EventTimeWatermark.add_pass(
        warehouse.layout.watermark_file(dc, stream), work_unit, stats.events - stats.future_events, stats.sketch,
        stats.at_or_after_watermark, WatermarkRule.of(settings),
    )


def watermark_metadata(mark: EventTimeWatermark) -> dict:
    """Plotted by the UI: how far the watermark lags the wall clock, and the share of the
    pass's events at or after the watermark that held when it came (Facebook §5.3's accuracy)."""
    return {
        "watermark_us": dg.IntMetadataValue(mark.watermark_us),
        "watermark_lag_seconds": dg.FloatMetadataValue(mark.lag_seconds(time.time_ns() // 1000)),
        "watermark_accuracy": dg.FloatMetadataValue(mark.last_accuracy),
        "watermark_window_passes": dg.IntMetadataValue(mark.window_passes),
    }
