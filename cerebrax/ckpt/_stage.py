"""Host copies of a state dict's arrays, taken on the caller's path.

A save writes host arrays. For a synchronous save they may be views of the caller's
memory (a jax CPU buffer, a numpy array, a CPU torch tensor), since nothing runs
until the file is written. A background save writes after ``save`` returned, when
the caller may have changed those arrays in place or donated the jax buffers to
its next step, so it stages copies it owns:

* jax arrays: off the CPU, every device-to-host copy is started
  (``copy_to_host_async``) before the first one is waited for, and the host value is a
  fresh array. On the CPU it is a view of the device buffer, which is copied so that
  the next step can donate that buffer (a buffer still viewed by numpy is not donated:
  XLA copies it, inside the step).
* numpy arrays and CPU torch tensors are copied: they can change after the call.
* numpy scalars are immutable, and so are lazy arrays from :func:`load`: they keep
  their file open, and a save onto that path replaces the name, not the file. The
  writer reads them.

Copies go into buffers kept from the previous background save when a buffer of the
same shape and dtype is free. Touching fresh memory costs more than the copy itself
on many hosts (page faults; on some virtual machines several seconds per GiB), and
a training run saves the same shapes every time.
"""

from __future__ import annotations

import sys
import threading
from collections import defaultdict
from typing import Any

import numpy as np

from ._flatten import Leaf, to_host
from ._lazy import LazyArray


def start_host_copies(leaves: list[Leaf]) -> None:
    """Starts the device-to-host copy of every jax leaf off the CPU, so that they overlap.

    A CPU buffer needs no copy to be read on the host. On jax 0.11, ``copy_to_host_async``
    of one kept a host view of it in the array, and the next step silently copied
    the buffer instead of donating it.
    """
    for leaf in leaves:
        if leaf.kind == "jax" and not isinstance(leaf.value, LazyArray):
            if not isinstance(leaf.value, sys.modules["jax"].core.Tracer):  # to_host refuses one
                if not _on_cpu(leaf.value):
                    leaf.value.copy_to_host_async()


def owned_host_arrays(leaves: list[Leaf]) -> list[np.ndarray | None]:
    """The leaves as host arrays that no caller can change.

    None stands for a lazy array: its file stays open while it lives and nobody
    writes to that file, so the writer reads it when it writes it.
    """
    start_host_copies(leaves)
    arrays: list[np.ndarray | None] = []
    for leaf in leaves:
        if isinstance(leaf.value, LazyArray):
            arrays.append(None)
            continue
        array = to_host(leaf)  # waits for this leaf's device-to-host copy
        arrays.append(BUFFERS.copy(array) if _aliases_caller_memory(leaf, array) else array)
    return arrays


def _aliases_caller_memory(leaf: Leaf, array: np.ndarray) -> bool:
    value = leaf.value
    if leaf.kind == "numpy_scalar":
        return False  # immutable
    if leaf.kind == "jax":  # off the CPU, np.asarray made a separate host copy
        return _on_cpu(value)
    if leaf.kind == "torch":  # .cpu() of a tensor elsewhere is already a copy
        return value.device.type == "cpu"
    return np.may_share_memory(array, value)


def _on_cpu(value: Any) -> bool:
    return any(device.platform == "cpu" for device in value.devices())


class _Buffers:
    """Host buffers by shape and dtype, lent to one background save at a time."""

    def __init__(self) -> None:
        self._free: defaultdict[tuple, list[np.ndarray]] = defaultdict(list)
        self._lent: set[int] = set()  # ids of the buffers made or lent by copy
        self._lock = threading.Lock()

    def copy(self, array: np.ndarray) -> np.ndarray:
        with self._lock:
            free = self._free[_shape_key(array)]
            buffer = free.pop() if free else None
        if buffer is None:
            buffer = np.empty_like(array, order="C")
        np.copyto(buffer, array)
        with self._lock:
            self._lent.add(id(buffer))
        return buffer

    def give_back(self, arrays: list[np.ndarray]) -> None:
        """Keeps the buffers among ``arrays`` for the next save, and drops those
        the previous save kept but this one did not use."""
        with self._lock:
            kept: defaultdict[tuple, list[np.ndarray]] = defaultdict(list)
            for array in arrays:
                if id(array) in self._lent:
                    kept[_shape_key(array)].append(array)
            self._free, self._lent = kept, set()

    def clear(self) -> None:
        with self._lock:
            self._free, self._lent = defaultdict(list), set()


def _shape_key(array: np.ndarray) -> tuple[Any, ...]:
    return array.shape, array.dtype.str


BUFFERS = _Buffers()
