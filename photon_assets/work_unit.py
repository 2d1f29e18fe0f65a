"""The run configuration of one work unit, as the dispatcher sensors request it or a catch-up run
cuts it for itself, and what the Dagster instance knows of work units from their runs' tags: which
are in flight, which failed for good."""


import datetime
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import dagster as dg
from pydantic import Field

from resources.registry.ownership import Share, claim_units, divide_clicks, shared_among_datacenters
from resources.settings import PipelineSettings, pipeline_settings
from resources.state.layout import DataLayout
from resources.state.work_unit_log import WorkUnit, WorkUnitLog, new_ranges, skipped_unit
from spark_ops.ingest import PassInputs
from spark_ops.meter import PassMeter, metered
from spark_ops.parse import ByteRange

LOG_RANGES = "log_ranges"  # newly arrived bytes of log files
# A work unit of no log bytes that retries its datacenter's pending clicks (a click's outcome "pending"
# is spark_ops/join.py's PENDING: it waits for its query).
PENDING_RETRY = "pending"

TAG_DC = "photon/dc"
TAG_STREAM = "photon/stream"
TAG_WORK_UNIT = "photon/work_unit"
TAG_KIND = "photon/kind"
TAG_ATTEMPT = "photon/attempt"
TAG_RECOVERED = "photon/recovered"  # on a work unit's failed last attempt: the recovery run that made it good


class LogRange(dg.Config):
    file: str
    start: int
    end: int


class WorkUnitConfig(dg.Config):
    dc: str = Field("", description="The datacenter whose logs the run reads. Empty: the first one under logs/.")
    work_unit: str = Field(
        "", description="The work unit, as a dispatcher cut it. Empty (Materialize in the UI): the run cuts a "
        "catch-up unit of every complete line of the datacenter's logs not yet in a work unit, under the "
        "dispatcher's rules (the work unit log, the other datacenters' shares), and is retried like any unit.")
    kind: str = Field(LOG_RANGES, description=f"`{LOG_RANGES}`: new log bytes; `{PENDING_RETRY}`: this datacenter's "
                      "pending clicks that are due (click runs only).")
    ranges: list[LogRange] = Field([], description="The unit's byte ranges [start, end) of log files under "
                                   "logs/<dc>/<stream>/, as the dispatcher cut them.")
    attempt: int = Field(1, description="Attempt of the work unit (retries count up).")
    # The same in every attempt, so that timestamp validity (spark_ops/validity.py) judges alike.
    clock_us: int = Field(0, description="The pipeline's clock for this unit (µs): when it was cut. 0: the run's start.")

    @property
    def token(self) -> str:
        """The registry token: the work unit, so that every attempt of it gets its own ids back."""
        return self.work_unit

    def clock(self) -> int:
        return self.clock_us or time.time_ns() // 1000

    def byte_ranges(self) -> list[ByteRange]:
        return [ByteRange(r.file, r.start, r.end) for r in self.ranges]

    def pass_inputs(self, layout: DataLayout, tables: dict[str, str], settings: PipelineSettings) -> PassInputs:
        """The unit as its pass is given it; with no clock in the config, the run's start (now)."""
        return PassInputs(self.dc, self.work_unit, self.attempt, self.byte_ranges(), self.clock(), layout, tables,
                          layout.staging_dir(self.work_unit, self.attempt), settings,
                          pending_only=self.kind == PENDING_RETRY)


def catch_up_config(dc: str, unit: WorkUnit) -> dict:
    """The run config of a unit a catch-up run cut for itself, as its retries name it."""
    return {"dc": dc, "work_unit": unit.id, "kind": LOG_RANGES, "clock_us": unit.clock_us,
            "ranges": [{"file": f, "start": s, "end": e} for f, s, e in unit.ranges]}


@dataclass
class WorkUnitMaker:
    """The one maker of a datacenter's work units, for the dispatchers and for a catch-up run: under
    the stream's work unit log lock (`locked`), this datacenter's share of the new lines (with several
    replicas, by the registry's leases and claims: `share`), cut into units that are recorded in the
    log and then claimed in the registry (`claim`), before any run is requested. `registry` gives the
    IdRegistry when it is first needed (a single datacenter never asks it)."""

    layout: DataLayout
    dc: str
    stream: str
    registry: Callable[[], Any]
    settings: PipelineSettings

    @property
    def shared(self) -> bool:
        return shared_among_datacenters(self.stream, self.layout.replicas())

    @contextmanager
    def locked(self) -> Iterator[WorkUnitLog]:
        with WorkUnitLog.locked(self.layout.work_unit_log(self.dc, self.stream)) as log:
            yield log

    def new_ranges(self, log: WorkUnitLog) -> list[tuple[str, int, int]]:
        return new_ranges(self.layout.stream_dir(self.dc, self.stream), log.next_offsets())

    def share(self, ranges: list, waiting: dict) -> Share | None:
        """This datacenter's share of `ranges` (None: the stream is not shared, or nothing is new)."""
        if not (self.shared and ranges):
            return None
        return divide_clicks(self.registry(), self.dc, ranges, waiting, self.settings.takeover_grace_seconds,
                             time.time())

    def claim(self, units: list[WorkUnit]) -> None:
        """Claims recorded units in the registry, so that the other datacenters wait for their bytes."""
        if self.shared:
            claim_units(self.registry(), self.dc, self.stream, units)


def unit_to_run(context: dg.AssetExecutionContext, config: WorkUnitConfig, stream: str, layout: DataLayout,
                registry: Callable[[], Any], settings: PipelineSettings) -> WorkUnitConfig | None:
    """The work unit this run does: the one its config names, else a catch-up unit it cuts now of
    every complete line of its datacenter's `stream` not yet in a work unit (None: there is none).

    The run takes the unit's tags before the unit is recorded: a crash in between leaves a failed
    run whose unit is in no log, which a retry then finds nothing to redo for (sensors/retries.py),
    and its bytes to the next cut. The unit's id carries the run's, so that a later unit never
    takes it."""
    if config.work_unit:
        return config
    replicas = layout.replicas()
    dc = config.dc or (replicas[0] if replicas else "")
    if dc not in replicas:
        raise dg.Failure(f"no logs of datacenter {dc!r} under {layout.logs}: datacenters there are {replicas}")
    clock_us = time.time_ns() // 1000
    maker = WorkUnitMaker(layout, dc, stream, registry, settings)
    with maker.locked() as log:
        ranges, skipped = maker.new_ranges(log), []
        share = maker.share(ranges, {})
        if share is not None:
            ranges, skipped = share.cut, share.skipped
        seq = len(log.units)
        unit = WorkUnit(f"{dc}.{stream}.{seq:08d}.{context.run_id[:8]}", seq, tuple(ranges),
                        run_id=context.run_id, clock_us=clock_us) if ranges else None
        if unit is not None:
            context.instance.add_run_tags(context.run_id, {TAG_DC: dc, TAG_STREAM: stream, TAG_KIND: LOG_RANGES,
                                                           TAG_WORK_UNIT: unit.id, TAG_ATTEMPT: "1"})
        log.append(([unit] if unit else []) + ([skipped_unit(f"{dc}.{stream}", seq + bool(unit), skipped)]
                                               if skipped else []))
        maker.claim([unit] if unit else [])
    if unit is None:
        context.log.info(f"catch-up: no complete lines of logs/{dc}/{stream}/ outside a work unit")
        return None
    context.log.info(f"catch-up: work unit {unit.id}, {unit.bytes} bytes of {len(unit.ranges)} range(s)")
    return WorkUnitConfig(**catch_up_config(dc, unit))


def bytes_behind_log_heads(layout: DataLayout, dc: str, stream: str) -> int:
    """Bytes of the datacenter's `stream` logs that no work unit holds yet: what the pipeline has
    still to cut, as of now."""
    offsets = WorkUnitLog.load(layout.work_unit_log(dc, stream)).next_offsets()
    return sum(end - start for _, start, end in new_ranges(layout.stream_dir(dc, stream), offsets))


UNFINISHED = {
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
}


# The ends of a run whose work unit is retried: failed, or canceled (photon up stopped while it ran or
# waited in the queue: photon/up.py).
ENDED_EARLY = [dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]


def failed_latest_attempts(instance: dg.DagsterInstance, filters: dg.RunsFilter) -> list[dg.RunRecord]:
    """For each work unit with a run ended early (ENDED_EARLY): its latest attempt, if that ended early
    and none succeeded."""
    failed_units = {
        record.dagster_run.tags[TAG_WORK_UNIT]
        for record in instance.get_run_records(filters)
        if TAG_WORK_UNIT in record.dagster_run.tags
    }
    latest = []
    for unit in sorted(failed_units):
        attempts = instance.get_run_records(dg.RunsFilter(tags={TAG_WORK_UNIT: unit}))
        if any(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS or r.dagster_run.status in UNFINISHED for r in attempts):
            continue
        latest.append(max(attempts, key=lambda r: int(r.dagster_run.tags.get(TAG_ATTEMPT, "1"))))
    return latest


def _failed_work_units(instance: dg.DagsterInstance, exhausted: bool) -> set[str]:
    return {r.dagster_run.tags[TAG_WORK_UNIT] for r in _failed_runs(instance, exhausted)}


def _failed_runs(instance: dg.DagsterInstance, exhausted: bool) -> list[dg.RunRecord]:
    max_attempts = pipeline_settings().max_attempts
    records = failed_latest_attempts(instance, dg.RunsFilter(statuses=ENDED_EARLY))
    return [
        r for r in records
        if (int(r.dagster_run.tags.get(TAG_ATTEMPT, "1")) >= max_attempts) == exhausted
        and TAG_RECOVERED not in r.dagster_run.tags
    ]


def runs_failed_for_good(instance: dg.DagsterInstance) -> list[dg.RunRecord]:
    """The last attempt of each work unit that failed max_attempts times and was not recovered."""
    return _failed_runs(instance, exhausted=True)


def mark_recovered(instance: dg.DagsterInstance, record: dg.RunRecord, recovery_run_id: str) -> None:
    """The recovery job made good the clicks of this failed work unit: it is no longer reported."""
    instance.add_run_tags(record.dagster_run.run_id, {TAG_RECOVERED: recovery_run_id})


def has_run(instance: dg.DagsterInstance, unit_id: str) -> bool:
    """Whether a run of the work unit was created (a dispatcher records a unit in its log before the
    daemon's machinery creates the run its tick requested)."""
    return bool(instance.get_run_ids(dg.RunsFilter(tags={TAG_WORK_UNIT: unit_id}), limit=1))


def work_units_awaiting_retry(instance: dg.DagsterInstance) -> set[str]:
    """Work units whose latest attempt failed and that will be retried."""
    return _failed_work_units(instance, exhausted=False)


def work_units_failed_for_good(instance: dg.DagsterInstance) -> set[str]:
    """Work units that failed max_attempts times: their clicks need a human (or recovery)."""
    return _failed_work_units(instance, exhausted=True)


def work_units_in_flight(instance: dg.DagsterInstance) -> set[str]:
    """Work units with a run not finished, or whose latest attempt failed (a retry will follow)."""
    running = {
        run.tags[TAG_WORK_UNIT]
        for run in instance.get_runs(dg.RunsFilter(statuses=list(UNFINISHED)))
        if TAG_WORK_UNIT in run.tags
    }
    return running | work_units_awaiting_retry(instance)


def log_runs_in_flight(instance: dg.DagsterInstance, dc: str, stream: str) -> int:
    """Runs of one datacenter's log work units of a stream (retries included), queued or running:
    the dispatcher's back-pressure."""
    return instance.get_runs_count(dg.RunsFilter(statuses=list(UNFINISHED), tags=_log_tags(dc, stream)))


def log_run_finished_since(instance: dg.DagsterInstance, dc: str, stream: str, since: float) -> bool:
    """Whether a run of one datacenter's log work units of a stream ended (or changed status) after
    `since` (epoch seconds), however it ended."""
    after = datetime.datetime.fromtimestamp(since, datetime.timezone.utc)
    ended = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
    return instance.get_runs_count(dg.RunsFilter(statuses=ended, tags=_log_tags(dc, stream), updated_after=after)) > 0


def _log_tags(dc: str, stream: str) -> dict[str, str]:
    return {TAG_DC: dc, TAG_STREAM: stream, TAG_KIND: LOG_RANGES}


def work_units_finished_since(instance: dg.DagsterInstance, since: float) -> set[str]:
    """Work units with a run that finished (or changed status) after `since` (epoch seconds)."""
    after = datetime.datetime.fromtimestamp(since, datetime.timezone.utc)
    return {
        record.dagster_run.tags[TAG_WORK_UNIT]
        for record in instance.get_run_records(dg.RunsFilter(updated_after=after))
        if TAG_WORK_UNIT in record.dagster_run.tags
    }


def run_start_costs(context: dg.AssetExecutionContext) -> dict[str, float]:
    """At a run's first Spark call, what the run cost before any work, as run metadata:
    `queued_seconds`, from its creation (a sensor's request) to its launch, and
    `launch_to_spark_seconds`, from its launch (a process started, Dagster and the code loaded, Spark
    reached) to now. A run launched in process (`photon run`) has no launch event: from its creation."""
    now = time.time()
    created = context.instance.get_run_record_by_id(context.run_id).create_timestamp.timestamp()
    launches = context.instance.get_records_for_run(
        context.run_id, of_type=dg.DagsterEventType.RUN_STARTING, limit=1
    ).records
    launched = launches[0].event_log_entry.timestamp if launches else created
    return {"queued_seconds": round(launched - created, 3), "launch_to_spark_seconds": round(now - launched, 3)}


@dataclass
class RunOpening:
    """What a work unit's asset starts from: the Spark session reached, the tables, the unit to run
    (None: a catch-up run found nothing to cut) and what its pass is given (`inputs`), and the pass's
    meter; `cost()` gives the run's phases, Spark jobs and start costs as metadata."""

    session: Any
    tables: dict[str, str]
    unit: WorkUnitConfig | None
    inputs: PassInputs | None
    meter: PassMeter
    cost: Callable[[], dict]


@contextmanager
def run_opening(context: dg.AssetExecutionContext, config: WorkUnitConfig, stream: str, spark, warehouse, registry,
                settings: PipelineSettings) -> Iterator[RunOpening]:
    """The opening the query and click assets share: the pass metered and its Spark jobs counted
    from the first call to Spark, then the unit this run does (`unit_to_run`)."""
    with metered() as meter, spark.jobs_counted(f"{context.run_id}/{context.op_def.name}") as jobs:
        session = spark.session()
        session.conf.get("spark.sql.shuffle.partitions")  # the first call: a Connect client reaches its server here
        start_costs = run_start_costs(context)
        meter.phase("spark_session")
        tables = warehouse.tables()
        unit = unit_to_run(context, config, stream, warehouse.layout, registry.get, settings)
        inputs = None if unit is None else unit.pass_inputs(warehouse.layout, tables, settings)
        yield RunOpening(session, tables, unit, inputs, meter, lambda: {**meter.metadata(), **jobs(), **start_costs})
