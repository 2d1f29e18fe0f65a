"""The query tailer: the EventStore's memory tier fed from the query logs as bytes land (Photon
§3.4.1-3.4.2: the joiner never waits for a batch of queries).

One long-lived process per datacenter (`photon event-store tail`), started and watched by `photon run`
and `photon up` beside the registry service, which holds the memory tier. Every `poll_seconds` it
reads the complete query lines appended since it last read, parses them with the query runs' own
parser (spark_ops/parse.py: `parse_chunks`, so a line it holds is one the query runs accept; bad
lines are left to the query runs' quarantine) and puts the valid ones into the memory tier in one
call that also records, in the registry service, where it read each file to and each writer's newest
query time (resources/event_store/memory_tier.py: `put_tailed`). A click run's lookup vouches for a miss by
those writer times, so clicks never wait for a query run: query runs still build the durable tier
(`query_logs`, `log_file_map`) at their own cadence, off the click path, from what the tailer parsed:
after each put it keeps the put's lines parsed (resources/event_store/tail_segments.py).

Restarted after a crash, it goes on from the offsets the registry service holds; a registry service
that restarted holds none, and the tailer reads the logs again from their first byte (the memory
tier keeps lines of `query_memory_seconds` and locates older queries at ~60 bytes each). It mirrors
its progress into the data directory for the dispatchers (resources/state/sidecars.py: `QueryTail`,
the writers' times as `QueryProgress`, and an event-time watermark), which pace the click lines by it
while it is fresh. Correctness never depends on it: a click whose query it has not put stays pending
(or is looked up in the durable and logs tiers), and the registry decides every click.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from dataclasses import asdict, dataclass, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from resources.event_store.memory_tier import TierLost
from resources.event_store.progress import QueryProgress, QueryTail
from resources.event_store.tail_segments import TailSegments
from resources.registry.api import IdRegistry
from resources.state.layout import DataLayout
from resources.state.sidecars import EventTimeWatermark
from resources.state.watermark import SKETCH_FRACTIONS, WatermarkRule
from resources.state.work_unit_log import WorkUnitLog, new_ranges
from spark_ops.parse import TEXT_FIELDS, ByteRange, parse_in_driver
from spark_ops.schemas import PARSED, arrow_schema

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5
# Lines parsed per put at most: a backlog is fed in pieces of this size, each recorded with its offsets.
PUT_BYTES = 16 << 20
# How often the tailer reads the query work unit log to delete the segments the query runs are done with.
CUT_READ_EVERY_SECONDS = 60.0
# How often its mirror (every file's offset) is written at most: a live stream's query logs gain ~13
# files a second, and encoding their offsets at every poll took a tenth of the tailer's CPU seven
# minutes into a live run (py-spy, 2026-12-01). The dispatchers read it to cut behind the tailer and to
# know whether query lines wait (a second late is a line cut or held a second later); freshness is
# TAIL_FRESH_SECONDS (10 s). Pacing goes by the tailer's watermark, written with each put.
MIRROR_EVERY_SECONDS = 1.0
PARSED_QUERY = arrow_schema(PARSED["query"])
TEXT_SCHEMA = pa.schema([PARSED_QUERY.field(name) for name in TEXT_FIELDS])


@dataclass(frozen=True)
class TailSettings:
    """The pipeline settings (resources/settings.py) a tailer goes by, handed to its process as JSON:
    the tailer imports neither Dagster nor the settings resource (~100 MB less in a process per
    datacenter)."""

    max_line_bytes: int
    future_tolerance_seconds: float
    query_tail_segment_bytes: int
    query_memory_seconds: float
    query_memory_bytes: int
    watermark_percentile: float
    watermark_windows: int
    watermark_max_passes: int

    @classmethod
    def of(cls, settings) -> "TailSettings":
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})

    def to_json(self) -> str:
        return json.dumps(asdict(self))


@dataclass
class Poll:
    bytes_read: int = 0
    lines_put: int = 0
    seconds: float = 0.0


class QueryTailer:
    """Feeds `dc`'s memory tier in the registry service from `dc`'s query logs (see the module
    docstring). Not thread-safe: one loop calls `poll`."""

    def __init__(self, layout: DataLayout, dc: str, registry: IdRegistry, settings: TailSettings):
        self.layout, self.dc, self.registry, self.settings = layout, dc, registry, settings
        self.stream_dir = layout.stream_dir(dc, "query")
        self.segments = TailSegments(layout.query_tail_segments_dir(dc), settings.max_line_bytes)
        self._cut_read_at = 0.0
        self._mirrored_at = float("-inf")
        self._resume(registry.tail_state(dc))

    def _resume(self, state: dict | None) -> None:
        """Goes on from what the memory tier holds of this datacenter (`tail_state`), or starts over."""
        if state is None:
            # A registry service that holds nothing of this datacenter: start over, and so do the
            # mirrors, which would otherwise claim what the new memory tier does not hold.
            for path in (self.layout.query_tail_file(self.dc), self.layout.query_tail_progress_file(self.dc),
                         self.layout.watermark_file(self.dc, "query_tail")):
                path.unlink(missing_ok=True)
            state = {"part": 0, "offsets": {}, "writers": {}}
        self.part, self.offsets, self.writers = state["part"], dict(state["offsets"]), dict(state["writers"])

    def poll(self) -> Poll:
        """Reads and puts what was appended up to this poll (up to PUT_BYTES a put); returns what it
        did. The logs are listed once a poll (the listing's cost grows with the files: lines
        appended during the puts wait for the next poll)."""
        started = time.monotonic()
        done = Poll()
        pending = new_ranges(self.stream_dir, self.offsets)
        while pending:
            ranges, pending = self._within_budget(pending)
            done.bytes_read += sum(end - start for _, start, end in ranges)
            try:
                done.lines_put += self._put(ranges)
            except TierLost as error:
                # The tier this tailer fed is gone (a replica of the registry died, or this client
                # moved to another): the one it reaches now holds nothing of this datacenter.
                log.warning("%s; starting over from the logs' first byte", error)
                self._resume(self.registry.tail_state(self.dc))
                break
            self._mirror()  # after a put (a backlog's puts take seconds each: its cut follows them put by put)
        if not done.bytes_read:
            self._mirror()  # fresh: a tailer with nothing to read is still feeding
        done.seconds = time.monotonic() - started
        return done

    def _within_budget(self, pending: list[tuple[str, int, int]]) -> tuple[list, list]:
        """The first PUT_BYTES of `pending` ranges, and the rest."""
        ranges, budget = [], PUT_BYTES
        for i, (file, start, end) in enumerate(pending):
            if budget <= 0:
                return ranges, pending[i:]
            # A range cut within the budget ends at a line's end: the parse of its last chunk reads
            # the line that starts before the cut whole, and the rest of the range goes next.
            cut = end if end - start <= budget else self._line_end(file, start + budget, end)
            ranges.append((file, start, cut))
            budget -= cut - start
            if cut < end:
                return ranges, [(file, cut, end), *pending[i + 1:]]
        return ranges, []

    def _line_end(self, file: str, at: int, end: int) -> int:
        with open(self.stream_dir / file, "rb") as f:
            f.seek(at)
            rest = f.readline(self.settings.max_line_bytes + 1)
        return min(end, at + len(rest)) if rest.endswith(b"\n") else end

    def _parse(self, ranges: list[tuple[str, int, int]]) -> tuple[pa.Table, pa.Table]:
        """The valid lines (TEXT_FIELDS) and every line parsed, as a query run stages it (no text), by
        the query runs' parser."""
        texts: list[pa.Table] = []
        parsed = parse_in_driver("query", self.stream_dir, [ByteRange(*r) for r in ranges], self.settings.max_line_bytes,
                                 text_sink=texts.append)
        return (pa.concat_tables(texts) if texts else TEXT_SCHEMA.empty_table()), parsed

    def _put(self, ranges: list[tuple[str, int, int]]) -> int:
        valid, parsed = self._parse(ranges)
        events = parsed.filter(pc.is_null(parsed["reason"])).select(["server_ip", "process_id", "timestamp_us"])
        latest_valid = time.time_ns() // 1000 + int(self.settings.future_tolerance_seconds * 1e6)
        # A query from the future is held but moves no writer's time (spark_ops/validity.py).
        in_time = events.filter(pc.less_equal(events["timestamp_us"], latest_valid))
        spans = self._writer_spans(in_time)
        writers = dict(self.writers)
        for name, (_, high) in spans.items():
            writers[name] = max(writers.get(name, high), high)
        read = {file: end for file, _, end in ranges}
        offsets = {**self.offsets, **read}
        self.part += 1
        self.registry.remember_tailed(self.dc, valid, {
            "part": self.part, "offsets": read, "writers": writers, "latest_valid_ts": latest_valid,
            "retention_seconds": self.settings.query_memory_seconds, "budget_bytes": self.settings.query_memory_bytes})
        self.offsets, self.writers = offsets, writers
        # After the put, which clicks wait for: the durable tier's runs read these lines from here.
        self._keep(ranges, parsed)
        # Mirrors, for the dispatchers only: written after the put, so they never claim more.
        QueryProgress.merge(self.layout.query_tail_progress_file(self.dc), spans)
        times = in_time["timestamp_us"].to_numpy()
        if len(times):
            mark = EventTimeWatermark.load(self.layout.watermark_file(self.dc, "query_tail")).watermark_us
            EventTimeWatermark.add_pass(
                self.layout.watermark_file(self.dc, "query_tail"), f"tail.{self.part}", len(times),
                [int(v) for v in np.quantile(times, SKETCH_FRACTIONS, method="lower")],
                int(len(times) if mark is None else (times >= mark).sum()), WatermarkRule.of(self.settings))
        return valid.num_rows

    def _keep(self, ranges: list[tuple[str, int, int]], parsed: pa.Table) -> None:
        """The parsed lines kept for the query runs. Only a saving: a segment not written (a full disk)
        leaves its query run to parse the lines itself."""
        try:
            self.segments.write(ranges, parsed)
            cut = None
            if time.monotonic() - self._cut_read_at >= CUT_READ_EVERY_SECONDS:  # a long log: not at every put
                cut, self._cut_read_at = WorkUnitLog.load(self.layout.work_unit_log(self.dc, "query")).next_offsets(), time.monotonic()
            self.segments.trim(self.settings.query_tail_segment_bytes, cut)
        except OSError as error:
            log.warning("query lines not kept for the query runs (they parse them): %s", error)

    @staticmethod
    def _writer_spans(events: pa.Table) -> dict[str, tuple[int, int]]:
        if not events.num_rows:
            return {}
        spans = events.group_by(["server_ip", "process_id"]).aggregate([("timestamp_us", "min"), ("timestamp_us", "max")])
        return {f"{ip}:{pid}": (low, high) for ip, pid, low, high in zip(*[
            spans[c].to_pylist() for c in ("server_ip", "process_id", "timestamp_us_min", "timestamp_us_max")])}

    def _mirror(self) -> None:
        """The mirror written, unless it was within MIRROR_EVERY_SECONDS."""
        if time.monotonic() - self._mirrored_at < MIRROR_EVERY_SECONDS:
            return
        QueryTail(offsets=self.offsets, part=self.part, updated_at=time.time()).save(self.layout.query_tail_file(self.dc))
        self._mirrored_at = time.monotonic()


def tail_forever(layout: DataLayout, dc: str, registry: IdRegistry, settings: TailSettings,
                 poll_seconds: float = POLL_SECONDS, stop: threading.Event | None = None) -> None:
    """Polls until `stop` is set, or SIGTERM / SIGINT arrive (in the main thread). The handler only
    appends to a list: setting an Event from a handler that interrupted that Event's own wait in the
    same thread deadlocks on its lock (a tailer stopped twice hung so)."""
    stop = stop or threading.Event()
    signalled: list[int] = []
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: signalled.append(signum))
    tailer = QueryTailer(layout, dc, registry, settings)
    log.info("tailing %s from part %d (%d file(s) read before)", tailer.stream_dir, tailer.part, len(tailer.offsets))
    while not (signalled or stop.is_set()):
        done = tailer.poll()
        if done.bytes_read:
            log.debug("put %d query lines (%d bytes) in %.2f s", done.lines_put, done.bytes_read, done.seconds)
        # A plain sleep: a signal's handler returns into it, and it ends within poll_seconds.
        time.sleep(max(0.0, poll_seconds - done.seconds))
