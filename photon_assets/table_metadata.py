"""What the UI shows of the Delta table behind an asset: its columns, on the asset's definition
(`dagster/column_schema`), and where it is and how many rows it holds, on each materialization
(`dagster/uri`, `dagster/row_count`)."""

from pathlib import Path

import dagster as dg

from spark_ops.tables import TABLE_SCHEMAS, row_count


def column_schema(name: str) -> dict:
    schema, _ = TABLE_SCHEMAS[name]
    columns = [dg.TableColumn(f.name, f.dataType.simpleString()) for f in schema.fields]
    return {"dagster/column_schema": dg.TableSchema(columns=columns)}


def table_uri(tables: dict[str, str], name: str) -> dict:
    return {"dagster/uri": Path(tables[name]).resolve().as_uri()}


def table_rows(session, tables: dict[str, str], names: list[str], quarantined: int) -> dict[str, int]:
    """The rows each of `names` holds after a pass, in that order; quarantined_lines' only when the
    pass quarantined a line (0 otherwise: most passes quarantine none, and a count reads the table's
    Delta log)."""
    return {name: row_count(session, name, tables[name]) if name != "quarantined_lines" or quarantined else 0
            for name in names}


def tables_as_they_are(session, tables: dict[str, str], names: list[str], dc: str) -> list[dg.MaterializeResult]:
    """The materializations of a catch-up run that found nothing new to read: each table as it is,
    so that its checks still run on it."""
    return [
        dg.MaterializeResult(asset_key=name, metadata={**table_uri(tables, name), "dc": dc, "work_unit": "",
                                                       "dagster/row_count": row_count(session, name, tables[name])})
        for name in names
    ]
