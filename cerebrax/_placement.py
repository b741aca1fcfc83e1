"""Placing values on devices and reading them back, in one process or several.

Placing: a host value (numpy, a Python number, an array on one local device) is the
GLOBAL value, identical on every process. Each process copies only the slices that its
own devices hold (``jax.make_array_from_callback``); nothing is sent between processes
and no collective runs, so placement is safe from data-loading threads. An array already
laid out on the target sharding is used as it is.

Reading: a value replicated over the mesh is read from this process's own copy. A value
split over devices of several processes is first gathered (a small program that every
process runs, in the same order; reading one on a single process hangs).

In a single process every sharding is fully addressable and these functions are
``jax.device_put`` and the identity. This module depends on JAX only: every layer of
cerebrax places values through it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, Sharding
from jax.sharding import PartitionSpec as P

__all__ = ["is_multiprocess", "local_device", "put", "put_many", "readable", "readable_tree",
           "to_host"]


def is_multiprocess() -> bool:
    """Whether this JAX runtime spans several processes (starts JAX's backends)."""
    return jax.process_count() > 1


def local_device(devices: Sequence[jax.Device]) -> jax.Device:
    """The first of ``devices`` that this process owns."""
    me = jax.process_index()
    for device in devices:
        if device.process_index == me:
            return device
    raise ValueError(f"process {me} owns none of the devices {list(devices)}")


def put(value: Any, sharding: Sharding) -> Any:
    """``value`` (the same global value on every process) laid out on ``sharding``."""
    if isinstance(value, jax.Array) and value.sharding == sharding:
        return value
    if sharding.is_fully_addressable:
        return jax.device_put(value, sharding)
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        return jax.device_put(value, sharding)  # a reshard among the same devices
    if isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype,
                                                              jax.dtypes.prng_key):
        # The key data has extra trailing dimensions, which the spec leaves unsplit.
        data = put(jax.random.key_data(value), sharding)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(value))
    # Host sync point for arrays on a local device: their value is copied to the host
    # once, then each local device receives its slice.
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def put_many(values: list, placement: Any) -> list:
    """``put`` for a list of values on one sharding or a matching list of shardings.

    A value already on its placement is kept as it is (a batch that the data stream
    placed is not placed again by the step). The rest goes through one
    ``jax.device_put`` when every placement is a device, None or fully addressable,
    as in a single process.
    """
    placements = list(placement) if isinstance(placement, (list, tuple)) else (
        [placement] * len(values))
    out = list(values)
    todo = [i for i, (v, p) in enumerate(zip(values, placements)) if not _placed_on(v, p)]
    if not todo:
        return out  # every value is already where it belongs: no second placement
    if all(_addressable(p) for i in todo for p in jax.tree.leaves(placements[i])):
        moved = jax.device_put([values[i] for i in todo], [placements[i] for i in todo])
    else:
        moved = [jax.tree.map(put, values[i], placements[i]) for i in todo]
    for i, value in zip(todo, moved):
        out[i] = value
    return out


def readable(value: Any) -> Any:
    """``value``, gathered first if it is split over devices of several processes.

    Every process must make the same call (the gather is a collective program).
    """
    if (not isinstance(value, jax.Array) or value.is_fully_addressable
            or value.sharding.is_fully_replicated):
        return value
    if not isinstance(value.sharding, NamedSharding):
        return multihost_utils.process_allgather(value, tiled=True)
    return _gather(NamedSharding(value.sharding.mesh, P()))(value)


def _placed_on(value: Any, placement: Any) -> bool:
    """Whether every array of ``value`` already lives on its part of ``placement``."""
    values = jax.tree.leaves(value)
    if isinstance(placement, (jax.Device, Sharding)):
        placements = [placement] * len(values)
    else:
        placements = jax.tree.leaves(placement)
    if not values or len(placements) != len(values):
        return False
    return all(_leaf_on(v, p) for v, p in zip(values, placements))


def _leaf_on(value: Any, placement: Any) -> bool:
    if not isinstance(value, jax.Array):
        return False
    if isinstance(placement, jax.Device):
        return value.sharding.device_set == {placement}
    return isinstance(placement, Sharding) and value.sharding == placement


def _addressable(placement: Any) -> bool:
    return (placement is None or isinstance(placement, jax.Device)
            or placement.is_fully_addressable)


@functools.lru_cache(maxsize=64)
def _gather(replicated: Sharding):
    return jax.jit(lambda x: x, out_shardings=replicated)


def readable_tree(tree: Any) -> Any:
    """``tree`` with leaves split over several processes gathered (see :func:`readable`).

    A tree whose array leaves are all fully addressable is returned as it is.
    """
    leaves = jax.tree.leaves(tree)
    if all(not isinstance(x, jax.Array) or x.is_fully_addressable for x in leaves):
        return tree
    return jax.tree.map(readable, tree)


def start_host_copies(arrays: Iterable[jax.Array]) -> None:
    """Starts the device-to-host copy of each array off the CPU, before the first wait.

    A CPU buffer is read on the host without a copy. On jax 0.11, ``copy_to_host_async``
    of one kept a host view of it in the array, and a step given that array silently
    copied the buffer instead of donating it (tests/ckpt/test_ckpt_background.py).
    """
    for x in arrays:
        if not any(device.platform == "cpu" for device in x.devices()):
            x.copy_to_host_async()


def to_host(tree: Any) -> Any:
    """``tree`` with every JAX array replaced by a numpy array (waits for the values).

    On a mesh that spans processes, an array split over several processes is gathered
    first, which every process does in the same order.
    """
    leaves, treedef = jax.tree.flatten(tree)
    leaves = [readable(x) for x in leaves]
    arrays = [x for x in leaves if isinstance(x, jax.Array)]
    if len(arrays) > 1:
        start_host_copies(arrays)
    return jax.tree.unflatten(
        treedef, [np.asarray(x) if isinstance(x, jax.Array) else x for x in leaves])
