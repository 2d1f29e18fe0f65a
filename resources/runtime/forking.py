"""What a process that forks without exec does first, so its children keep sharing its memory."""

import gc


def freeze_before_fork() -> None:
    """The objects this process holds moved out of the garbage collector's reach. A child shares its
    parent's pages until something writes to them, and a collection in the child writes to every
    object it traverses; frozen ones it skips (the gc module's advice for a fork without exec).
    Garbage is collected first, so that none is kept for good. Probe (docs/STACK.md, Dagster): four
    children each collecting held 38 MB of PSS each against 99 MB (the run server's state) and 18 MB
    against 35 MB (the Python worker daemon's)."""
    gc.collect()
    gc.freeze()
