"""What the UI shows of the Delta table behind an asset: its columns, on the asset's definition
(`dagster/column_schema`), and where it is, on each materialization (`dagster/uri`)."""

from pathlib import Path

import dagster as dg

from spark_ops.tables import TABLE_SCHEMAS


def column_schema(name: str) -> dict:
    schema, _ = TABLE_SCHEMAS[name]
    columns = [dg.TableColumn(f.name, f.dataType.simpleString()) for f in schema.fields]
    return {"dagster/column_schema": dg.TableSchema(columns=columns)}


def table_uri(tables: dict[str, str], name: str) -> dict:
    return {"dagster/uri": Path(tables[name]).resolve().as_uri()}
