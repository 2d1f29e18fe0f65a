"""Spark work started beside the caller's, on a thread of its own, for a write that nothing after it
reads until it must be committed (a click run's ledger append beside its lookup and registry commit,
its output appends beside each other).

The thread is PySpark's `InheritableThread`: its jobs carry the caller's job group (local session)
or tags (Spark Connect), so a run's job count includes them, and Spark's FAIR pool shares the
executors between the two threads' jobs. It runs in a copy of the caller's context, so the Delta
commits it makes count into the caller's pass meter (spark_ops/meter.py).
"""

from __future__ import annotations

import contextvars
from concurrent.futures import Future
from typing import Callable, TypeVar

from pyspark.sql import SparkSession
from pyspark.util import InheritableThread

T = TypeVar("T")


def beside(spark: SparkSession, work: Callable[[], T], name: str) -> Future[T]:
    """Starts `work` on a thread of its own; its result, or the exception it raised, is the future's."""
    future: Future[T] = Future()
    context = contextvars.copy_context()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(context.run(work))
        except BaseException as error:  # handed to whoever waits for it
            future.set_exception(error)

    InheritableThread(run, session=spark, name=name, daemon=True).start()
    return future


def settle(future: Future | None) -> None:
    """Waits for `future` (None: nothing to wait for) and re-raises what its work raised."""
    if future is not None:
        future.result()


def settle_quietly(future: Future | None) -> None:
    """Waits for `future` without raising: for a caller already failing, whose own error is the one
    to report, and that must not leave the work running (it reads files the caller deletes next)."""
    if future is not None:
        future.exception()


def side_by_side(spark: SparkSession, works: list[Callable[[], object]], name: str) -> None:
    """Runs `works` at once, the first on this thread and the others beside it, and returns once every
    one has ended; the first error raised, if any, after that. Delta commits to different tables: each
    spends much of its time in the driver (the commit protocol, the snapshot), which the others' jobs
    can use."""
    futures = [beside(spark, work, f"{name}-{i}") for i, work in enumerate(works[1:], 1)]
    try:
        if works:
            works[0]()
    finally:
        for future in futures:
            settle_quietly(future)  # none left running, whatever happened
    for future in futures:
        settle(future)
