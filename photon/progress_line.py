"""`photon run`'s progress on a terminal: one line on stderr, redrawn every second, per datacenter and
stream the bytes left (complete log lines no work unit holds yet, and the units cut but not finished),
for the click stream the clicks joined per second, and an ETA at the rate bytes were finished so far:

    dc1: query 12.4 MB left, ETA 0:00:09; click 3.1 MB left, 812 clicks/s, ETA 0:00:04 | dc2: ...

Drawn with `rich` (a live display that rewrites its line), only when stderr is a terminal and `--json`
was not asked for: otherwise `photon run` prints exactly what it printed before. The clicks joined come
from joined_clicks' materializations in the instance (`clicks_joined`, `dc`), read incrementally."""

from __future__ import annotations

import logging
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import dagster as dg

from photon_assets.work_unit import bytes_behind_log_heads, work_units_in_flight
from resources.runtime.repeating import repeated
from resources.state.layout import STREAMS, DataLayout
from resources.state.work_unit_log import WorkUnitLog

REFRESH_SECONDS = 1.0


@dataclass
class StreamProgress:
    """What one datacenter's stream has left, and how fast it is finished."""

    started_at: float
    finished_at_start: int | None = None
    left: int = 0
    finished: int = 0

    def rate(self, now: float) -> float:
        elapsed = now - self.started_at
        return (self.finished - (self.finished_at_start or 0)) / elapsed if elapsed > 0 else 0.0

    def eta(self, now: float) -> str:
        rate = self.rate(now)
        if not self.left:
            return "done"
        if rate <= 0:
            return "ETA ?"
        seconds = int(self.left / rate)
        return f"ETA {seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def megabytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


@dataclass
class Progress:
    """The progress line of `photon run` over these datacenters (`update` after each pass, `close` at the end)."""

    layout: DataLayout
    datacenters: list[str]
    instance: dg.DagsterInstance
    started_at: float = field(default_factory=time.monotonic)
    streams: dict = field(default_factory=dict)
    joined: dict = field(default_factory=dict)  # clicks joined since the start, per datacenter
    cursor: str | None = None
    looked: bool = False
    live: object = None
    logs: list = field(default_factory=list)  # the log handlers pointed above the line, with their streams

    def measure(self) -> None:
        in_flight = work_units_in_flight(self.instance)
        for dc in self.datacenters:
            for stream in STREAMS:
                units = WorkUnitLog.load(self.layout.work_unit_log(dc, stream)).units
                pending = sum(u.bytes for u in units if u.id in in_flight)
                progress = self.streams.setdefault((dc, stream), StreamProgress(time.monotonic()))
                progress.left = bytes_behind_log_heads(self.layout, dc, stream) + pending
                progress.finished = sum(u.bytes for u in units if not u.skipped) - pending
                if progress.finished_at_start is None:
                    progress.finished_at_start = progress.finished
        self.count_joined()

    def count_joined(self) -> None:
        """Clicks joined by the click runs that materialized joined_clicks since the start (the first look
        only finds where the instance's materializations are)."""
        key = dg.AssetKey("joined_clicks")
        if not self.looked:
            newest = self.instance.fetch_materializations(key, limit=1)
            self.cursor, self.looked = newest.cursor if newest.records else None, True
            return
        while True:
            found = self.instance.fetch_materializations(key, limit=100, cursor=self.cursor, ascending=True)
            for record in found.records:
                metadata = record.asset_materialization.metadata
                if "dc" in metadata and "clicks_joined" in metadata:
                    dc = metadata["dc"].value
                    self.joined[dc] = self.joined.get(dc, 0) + int(metadata["clicks_joined"].value)
            self.cursor = found.cursor if found.records else self.cursor
            if not found.has_more:
                return

    def line(self) -> str:
        now, parts = time.monotonic(), []
        for dc in self.datacenters:
            streams = []
            for stream in STREAMS:
                progress = self.streams[(dc, stream)]
                rate = f", {self.joined.get(dc, 0) / max(now - self.started_at, 1e-9):.0f} clicks/s" if stream == "click" else ""
                streams.append(f"{stream} {megabytes(progress.left)} left{rate}, {progress.eta(now)}")
            parts.append(f"{dc}: " + "; ".join(streams))
        return " | ".join(parts)

    def update(self) -> None:
        from rich.text import Text

        self.measure()
        text = Text(self.line(), no_wrap=True, overflow="ellipsis")
        if self.live is None:
            from rich.console import Console
            from rich.live import Live

            self.live = Live(text, console=Console(file=sys.stderr), auto_refresh=False, redirect_stdout=False,
                             redirect_stderr=False)
            self.live.start()
            self.logs = logs_above(self.live.console)
        self.live.update(text, refresh=True)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            for handler, stream in self.logs:
                handler.setStream(stream)


class AboveTheLine:
    """The stream of the log's handlers while the line is shown: each record printed above the line (rich
    prints above a live display), not run into it."""

    def __init__(self, console):
        self.console = console

    def write(self, text: str) -> None:
        if text.strip():
            self.console.print(text.rstrip("\n"), markup=False, highlight=False, emoji=False, soft_wrap=True)

    def flush(self) -> None:
        pass


def logs_above(console) -> list[tuple[logging.StreamHandler, object]]:
    """The root log's handlers on stderr, pointed above the line; their streams before."""
    swapped = []
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr:
            swapped.append((handler, handler.setStream(AboveTheLine(console))))
    return swapped


@contextmanager
def shown(progress: Progress | None, log: logging.Logger) -> Iterator[None]:
    """The progress line redrawn every REFRESH_SECONDS on a thread of its own while the block runs (`photon
    run` executes its runs inside its sensor passes: a pass may take a minute); never an error of the run's."""
    if progress is None:
        yield
        return

    def refresh() -> None:
        try:
            progress.update()
        except Exception:  # noqa: BLE001 - a display, never a reason to stop
            log.debug("the progress line failed to refresh", exc_info=True)

    try:
        with repeated(refresh, REFRESH_SECONDS, "progress"):
            yield
    finally:
        progress.close()


def progress_for(enabled: bool, layout: DataLayout, datacenters: list[str], instance: dg.DagsterInstance) -> Progress | None:
    """The progress line, when asked for and stderr is a terminal."""
    return Progress(layout, datacenters, instance) if enabled and sys.stderr.isatty() else None
