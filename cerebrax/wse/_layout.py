"""Where state and batches live on the wafer mesh, per execution mode.

``replica``: every state leaf is replicated; batch leaves are split along their first
dimension over ``("csx", "replica")``. Because the traced program is one global-view
``jax.jit`` program, the loss is the mean over the global batch and XLA's SPMD
partitioner inserts the gradient all-reduce: gradients equal the single-device ones.

``pipeline``: each state leaf is split over ``"stage"`` along its largest dimension that
the stage count divides (the others replicated), so a stage device holds ``1 / S`` of the
parameters and optimizer state; the pipeline brings each stage its own layers'
parameters inside the step (:mod:`._pipeline`). Batches are split over ``"csx"``.

``weight_streaming`` and ``sharded``: each state leaf is split over ``"wgt"`` along its
largest dimension that the server count divides (scalars and indivisible leaves are
replicated); batches reach the step split over ``"csx"``. Parameters and optimizer
state live on the servers in shards and the optimizer update runs on the shards. In
weight-streaming mode the model call then splits each system's rows over its
``"wgt"`` devices too and gathers each layer's weights just in time
(:mod:`._streaming`); in sharded mode (and in weight-streaming mode for a model
without layers) XLA's SPMD partitioner inserts what each layer needs (gathering the
layer's weights, or keeping them split and moving activations, whichever it finds
cheaper for the shapes).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .._filters import is_prng_key
from ..errors import ConfigError
from ._mesh import Wafer

__all__ = ["Layout", "SHARDED_MODES"]

# The modes whose state lives split over the "wgt" axis between steps.
SHARDED_MODES = ("weight_streaming", "sharded")


class Layout:
    """Shardings of state leaves and batch leaves for one :class:`Wafer`."""

    def __init__(self, wafer: Wafer):
        self.wafer = wafer
        self.mesh = wafer.mesh
        self.replicated = NamedSharding(self.mesh, P())
        self.batch = NamedSharding(self.mesh, P(wafer.data_axes))

    # ---- state ------------------------------------------------------------------------
    def state_sharding(self, leaf: Any) -> NamedSharding:
        """The sharding of state leaf ``leaf`` between steps.

        In the pipeline, weight-streaming and sharded modes, the leaf is split over
        :attr:`Wafer.inner_axis` along its largest dimension that the axis size divides;
        in replica mode, and for scalars, PRNG keys and leaves without such a dimension,
        it is replicated.
        """
        if self.wafer.mode not in (*SHARDED_MODES, "pipeline"):
            return self.replicated
        shape = tuple(getattr(leaf, "shape", ()))
        dim = _largest_divisible_dim(shape, self.wafer.inner_size)
        if dim is None or is_prng_key(leaf):
            return self.replicated
        spec = [None] * len(shape)
        spec[dim] = self.wafer.inner_axis
        return NamedSharding(self.mesh, P(*spec))

    def state_shardings(self, values: Any) -> Any:
        """A pytree of shardings matching ``values``."""
        return jax.tree.map(self.state_sharding, values)

    # ---- batches ----------------------------------------------------------------------
    def input_sharding(self, leaf: Any, name: str = "input") -> NamedSharding:
        """Split along dim 0 over the data-parallel axes; scalars are replicated."""
        shape = tuple(getattr(leaf, "shape", ()))
        if not shape:
            return self.replicated
        size = self.wafer.data_parallel_size
        if shape[0] % size:
            axes = " x ".join(f"{a}={self.mesh.shape[a]}" for a in self.wafer.data_axes)
            good = max(size, (shape[0] // size) * size)
            raise ConfigError(
                f"The batch of `{name}` has {shape[0]} rows (shape {shape}), which the "
                f"{self.wafer.mode!r} layout cannot split over its {size} data-parallel "
                f"devices ({axes}). Fix: use a batch size divisible by {size}, e.g. "
                f"{good}, or change the ClusterConfig."
            )
        return self.batch

    def place_state(self, values: Any) -> Any:
        """``values`` (a pytree of state) placed on the mesh in their
        :meth:`state_shardings`."""
        return jax.device_put(values, self.state_shardings(values))


def _largest_divisible_dim(shape: tuple[int, ...], n: int) -> int | None:
    best = None
    for d, size in enumerate(shape):
        if size >= n and size % n == 0 and (best is None or size > shape[best]):
            best = d
    return best


def sharded_bytes(leaf: Any, sharding: Any) -> int:
    """Bytes one device holds of ``leaf`` under ``sharding``."""
    shape = tuple(leaf.shape)
    shard = sharding.shard_shape(shape) if shape else ()
    return int(np.prod(shard, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
