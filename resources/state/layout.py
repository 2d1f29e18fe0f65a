"""Where everything lives under a data directory (docs/ARCHITECTURE.md: all state is under `<data-dir>`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR_ENV = "PHOTON_DATA_DIR"
DATACENTERS_ENV = "PHOTON_DATACENTERS"
STREAMS = ("query", "click")


@dataclass(frozen=True)
class DataLayout:
    root: Path

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def stream_dir(self, dc: str, stream: str) -> Path:
        return self.logs / dc / stream

    @property
    def warehouse(self) -> Path:
        return self.root / "warehouse"

    def table(self, name: str) -> str:
        return str(self.warehouse / name)

    @property
    def registry_dir(self) -> Path:
        return self.root / "registry"

    def work_unit_log(self, dc: str, stream: str) -> Path:
        """The dispatcher's work units of one datacenter's stream (resources/state/work_unit_log.py)."""
        return self.root / "state" / "dispatcher" / dc / f"{stream}.jsonl"

    def query_progress_file(self, dc: str) -> Path:
        return self.root / "state" / "streams" / dc / "query_progress.json"

    def query_tail_file(self, dc: str) -> Path:
        """Where the query tailer (photon/query_tail.py) has read each query log to, and when."""
        return self.root / "state" / "streams" / dc / "query_tail.json"

    def query_tail_progress_file(self, dc: str) -> Path:
        """The query writers' times the query tailer has put into the memory tier (QueryProgress)."""
        return self.root / "state" / "streams" / dc / "query_tail_progress.json"

    def query_tail_segments_dir(self, dc: str) -> Path:
        """The query tailer's parsed lines, for the query runs (resources/event_store/tail_segments.py)."""
        return self.root / "state" / "streams" / dc / "query_tail_segments"

    def query_progress_files(self, dc: str) -> tuple[Path, Path, Path]:
        """What the known progress of the query stream is read from (resources/event_store/progress.py, known_query_progress)."""
        return self.query_progress_file(dc), self.query_tail_file(dc), self.query_tail_progress_file(dc)

    def pending_digest_file(self, dc: str) -> Path:
        return self.root / "state" / "streams" / dc / "pending_clicks.json"

    def watermark_file(self, dc: str, stream: str) -> Path:
        return self.root / "state" / "streams" / dc / f"{stream}_watermark.json"

    def query_cache_file(self, dc: str) -> Path:
        return self.root / "state" / "streams" / dc / "query_cache.json"

    @property
    def removals_file(self) -> Path:
        """When table maintenance removed files from each table, until they are vacuumed (photon_assets/maintenance.py)."""
        return self.root / "state" / "maintenance" / "removals.json"

    @property
    def alerts_dir(self) -> Path:
        """The alerts' outbox (resources/state/alert_outbox.py)."""
        return self.root / "state" / "alerts"

    @property
    def staging(self) -> Path:
        return self.root / "staging"

    def staging_dir(self, work_unit: str, attempt: int) -> Path:
        """One attempt of a work unit's intermediate results, written once each and read back."""
        return self.staging / f"{work_unit}.a{attempt}"

    @property
    def dagster_home(self) -> Path:
        return self.root / "dagster"

    def datacenters(self) -> list[str]:
        """Datacenters to run: PHOTON_DATACENTERS if set, else every replica."""
        selected = os.environ.get(DATACENTERS_ENV)
        if selected:
            return [dc for dc in selected.split(",") if dc]
        return self.replicas()

    def replicas(self) -> list[str]:
        """Every replica directory under logs/: the datacenters sharing the click lines."""
        if not self.logs.is_dir():
            return []
        return sorted(p.name for p in self.logs.iterdir() if p.is_dir() and not p.name.startswith("."))


TABLES = (
    "query_logs",
    "log_file_map",
    "click_ledger",
    "pending_clicks",
    "joined_clicks",
    "unjoinable_clicks",
    "click_aggregates",
    "quarantined_lines",
)
