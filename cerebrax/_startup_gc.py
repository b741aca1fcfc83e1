"""Python's cyclic garbage collector, held back from launch to the end of the first step.

Start-up makes about a million objects that live for the whole run: torch's, JAX's and
the script's modules, classes and functions, then the step's trace. CPython's collector
scans every tracked object each time its oldest generation has grown by a quarter, so
start-up pays a full scan at each such step of growth: a gigaGPT-style script spent
about 1 s in 7 full collections before its first step (``benchmarks/RESULTS.md``,
start-up), and found little garbage in them.

:func:`hold` raises the collector's thresholds, once per process: the youngest
generation is still collected every 10 000 allocations (a reference cycle made and
dropped within that is freed as before), the older ones wait. :func:`release` puts the
thresholds back at the end of the first traced step (run, compiled or validated, or
failed), unless the script set its own meanwhile, which then stay. No object is exempt
from collection, and none is freed differently: garbage among older objects is freed at
a later collection. At the release, the objects start-up made join the oldest
generation (``gc.freeze()`` then ``gc.unfreeze()``), where a collection of the younger
ones would have moved them as survivors, but without the scan of all of them that
collection makes right after the thresholds come down. That scan is deferred, not
saved: the first full collection after the release scans everything once.

``cerebrax run`` holds from its launch, so the script's imports are covered too; a
script run with ``python`` holds from its first backend. A process forked while the
collector is held (the worker server, a DataLoader worker) gets the thresholds as they
were before. ``CEREBRAX_STARTUP_GC=0`` leaves the collector alone.
"""

from __future__ import annotations

import gc
import os

from ._runtime import RUNTIME

__all__ = ["hold", "release"]

_HELD = (10_000, 1_000, 1_000)  # the thresholds while held (at least these)


def hold() -> None:
    """Raises the collector's thresholds until :func:`release` (once per process; not
    where ``CEREBRAX_STARTUP_GC=0`` or the script turned automatic collection off)."""
    if RUNTIME.startup_gc_used:
        return
    RUNTIME.startup_gc_used = True
    if os.environ.get("CEREBRAX_STARTUP_GC", "1").strip() == "0":
        return
    saved = gc.get_threshold()
    if saved[0] == 0:  # threshold 0: the script turned automatic collection off
        return
    gc.set_threshold(*(max(old, new) for old, new in zip(saved, _HELD)))
    RUNTIME.startup_gc_thresholds = (saved, gc.get_threshold())
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=release)


def release() -> None:
    """Puts the collector's thresholds back as they were before :func:`hold`, unless the
    script has set others since."""
    if RUNTIME.startup_gc_thresholds is None:
        return
    saved, raised = RUNTIME.startup_gc_thresholds
    RUNTIME.startup_gc_thresholds = None
    if gc.get_threshold() == raised:
        gc.set_threshold(*saved)
    # What start-up made joins the oldest generation, as a collection of the younger
    # ones would have moved it (it survived), without that collection's scan of it all.
    gc.freeze()
    gc.unfreeze()
