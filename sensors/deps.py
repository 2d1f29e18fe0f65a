"""What the sensors use besides their context, made once per process.

Dagster builds a sensor's resources on every tick, and with them a DagsterInstance from the
tick's instance reference (`SensorEvaluationContext.resources`, `.instance`). Under `photon up`
that was most of the code server's CPU: py-spy on an idle deployment put 33 % of its sensor
evaluations in `DagsterInstance.from_ref` (its storage's schema check) and 26 % in building the
resources, for sensors that tick every few seconds each; `photon run` pays the same in its own
process on every pass. So the sensors declare no resources: the code location hands each sensor
factory a `SensorDeps` (the deployment's settings, and its registry opened on first use), and a
sensor takes its instance from `sensor_instance`, one per instance reference per process.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import dagster as dg

from resources.registry.api import IdRegistry
from resources.settings import PipelineSettings


@dataclass(frozen=True)
class SensorDeps:
    settings: PipelineSettings
    # The registry, opened when first asked for: a single datacenter's dispatchers never ask, and
    # an embedded registry holds its DuckDB files for the whole process once opened.
    registry: Callable[[], IdRegistry]
    # Whether the daemon ticks these sensors, each on a thread of its own (`photon up`): only then may
    # a tick wait (sensors/dispatcher.py: await_run_end); `photon run` ticks them one after another.
    ticked_by_daemon: bool = False
    # When this process made its sensors (epoch seconds): the JVM the runs share starts with it, so
    # until its first click run ends the query dispatcher starts no durable-tier run beside it
    # (sensors/dispatcher.py: query_run_deferred). 0: no start to mind (a test's single tick).
    started_at: float = 0.0


_instances: dict[str, dg.DagsterInstance] = {}
_instances_lock = threading.Lock()


def sensor_instance(context: dg.SensorEvaluationContext) -> dg.DagsterInstance:
    """The instance a tick reads runs and events from: one per instance reference in this process
    (kept, never disposed: the process serves sensors until it stops), or the context's own when
    it was built with an instance (`dg.build_sensor_context(instance=...)`). `instance_ref` is not
    in Dagster's public API; without it the daemon's instance cannot be told from another one."""
    ref = context.instance_ref
    if ref is None:
        return context.instance
    key = dg.serialize_value(ref)
    with _instances_lock:
        if key not in _instances:
            _instances[key] = dg.DagsterInstance.from_ref(ref)
        return _instances[key]
