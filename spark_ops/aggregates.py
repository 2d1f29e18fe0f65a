"""Partial aggregation of joined clicks (Ubiq §4): per advertiser and event-time minute."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def aggregate_clicks(joined: DataFrame) -> DataFrame:
    return joined.groupBy(
        "advertiser_id",
        F.date_trunc("minute", F.timestamp_micros("timestamp_us")).alias("minute"),
    ).agg(F.count("*").alias("clicks"), F.sum("cost_micros").alias("cost_micros"))
