"""Where a pipeline reads logs and writes its tables: the data directory's layout as a resource."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from resources.state.layout import TABLES, DataLayout


class WarehouseResource(dg.ConfigurableResource):
    """The data directory (docs/ARCHITECTURE.md: all state lives under it). Tables are Delta under warehouse/."""

    data_dir: str

    @property
    def layout(self) -> DataLayout:
        return DataLayout(Path(self.data_dir).resolve())

    def tables(self) -> dict[str, str]:
        return {name: self.layout.table(name) for name in TABLES}
