"""Pending clicks and quarantined lines, as assets a user can open in the UI.

Both are Delta tables the runs write as a side effect: pending clicks by every click run, quarantined
lines by query and click runs alike. Dagster lets one op only materialize an asset, so they are
declared as external assets, and each run that changes one logs its materialization, with the
table's row count, location and what the run changed.
"""

import dagster as dg

from photon_assets.table_metadata import column_schema, table_uri

PENDING_CLICKS = dg.AssetSpec(
    "pending_clicks",
    deps=["click_ledger"],
    description="Clicks whose query was not found yet, per datacenter, with their lookups so far; retried "
    "when query data that could hold their query arrives, unjoinable past the unjoinable age (Delta).",
    metadata=column_schema("pending_clicks"),
    kinds={"delta"},
    group_name="joiner",
)
QUARANTINED_LINES = dg.AssetSpec(
    "quarantined_lines",
    description="Log lines that break the input contract, query and click, with the reason, the file "
    "and byte offset, and the first 200 characters (Delta).",
    metadata=column_schema("quarantined_lines"),
    kinds={"delta"},
    group_name="event_store",
)
SPECS = [PENDING_CLICKS, QUARANTINED_LINES]


def pending_clicks_changed(tables: dict[str, str], rows: int, common: dict, pending_in_dc: int) -> dg.AssetMaterialization:
    return dg.AssetMaterialization(
        asset_key=PENDING_CLICKS.key,
        metadata={**table_uri(tables, "pending_clicks"), **common, "dagster/row_count": rows,
                  "pending_clicks_in_dc": pending_in_dc},
    )


def lines_quarantined(tables: dict[str, str], rows: int, common: dict, stream: str, added: int) -> dg.AssetMaterialization:
    return dg.AssetMaterialization(
        asset_key=QUARANTINED_LINES.key,
        metadata={**table_uri(tables, "quarantined_lines"), **common, "dagster/row_count": rows, "stream": stream,
                  "lines_added": added},
    )
