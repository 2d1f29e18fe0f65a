"""The run configuration of one work unit, as the dispatcher sensors request it."""


import dagster as dg

from spark_ops.parse import ByteRange

LOG_RANGES = "log_ranges"  # newly arrived bytes of log files
PENDING = "pending"  # this datacenter's clicks still waiting for their query

TAG_DC = "photon/dc"
TAG_STREAM = "photon/stream"
TAG_WORK_UNIT = "photon/work_unit"
TAG_KIND = "photon/kind"
TAG_ATTEMPT = "photon/attempt"
TAG_PENDING = "photon/pending"
TAG_RECOVERED = "photon/recovered"  # on a work unit's failed last attempt: the recovery run that made it good


class LogRange(dg.Config):
    file: str
    start: int
    end: int


class WorkUnitConfig(dg.Config):
    dc: str
    work_unit: str
    kind: str = LOG_RANGES
    ranges: list[LogRange] = []
    attempt: int = 1

    @property
    def token(self) -> str:
        """The registry token: the work unit, so that every attempt of it gets its own ids back."""
        return self.work_unit

    def byte_ranges(self) -> list[ByteRange]:
        return [ByteRange(r.file, r.start, r.end) for r in self.ranges]
