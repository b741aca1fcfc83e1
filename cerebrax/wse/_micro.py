"""Micro-batching outside pipeline mode: ``ClusterConfig(micro_batch_size=...)``.

In weight-streaming and replica mode a ``micro_batch_size`` makes every model call
process each system's rows in micro-batches of that size, one after the other, as the
wafer does to bound its activation memory. The call becomes a ``jax.lax.scan`` over the
micro-batches whose body is a ``jax.checkpoint``: the backward pass keeps only each
micro-batch's inputs and recomputes its activations, so the activations of one
micro-batch are alive at a time. Gradients add up over the micro-batches (the scan's
transpose), so a model without coupling between rows gives the same outputs and
gradients as one call on the whole batch.

Micro-batch ``m`` holds the ``m``-th ``micro_batch_size`` rows of every system (the
systems' rows stay split over ``"csx"``); BatchNorm in train mode normalizes over those
rows and updates its running statistics once per micro-batch, in order, as one device
does when it calls the model on the micro-batches one after the other. A call that
draws random numbers gets the key ``fold_in(key, m)`` for micro-batch ``m``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .._tree import combine
from ..errors import ConfigError
from ._inputs import _batch_of, _micro_batches, split_inputs

__all__ = ["micro_batched_apply"]

WHAT = "ClusterConfig(micro_batch_size=...)"

ApplyFn = Callable[[dict, dict, tuple, dict, Any], tuple[Any, dict]]


def micro_batched_apply(apply: ApplyFn, micro_batch_size: int, num_csx: int,
                        params: dict, buffers: dict, args: tuple, kwargs: dict, key: Any,
                        rows_sharding: Any = None) -> tuple[Any, dict]:
    """Runs ``apply(params, buffers, args, kwargs, key) -> (outputs, new_buffers)`` on
    the micro-batches of ``args`` / ``kwargs`` (see the module docstring).

    ``rows_sharding`` (optional) is where one micro-batch's rows live on the mesh.
    Returns the outputs on the whole batch, in the original row order, and the buffers
    after the last micro-batch.
    """
    names = ["inputs" + jax.tree_util.keystr(p)
             for p, _ in jax.tree_util.tree_flatten_with_path((args, kwargs))[0]]
    batch = _batch_of(jax.tree.leaves((args, kwargs)), names, WHAT)
    count = _micro_batches(batch, num_csx, micro_batch_size, 1, WHAT)
    if count == 1:
        return apply(params, buffers, args, kwargs, key)
    rows = num_csx * micro_batch_size  # one micro-batch, all systems

    def split(x: jax.Array) -> jax.Array:
        # [batch, ...] = [csx, m, micro, ...] -> [m, csx * micro, ...]
        x = x.reshape(num_csx, count, micro_batch_size, *x.shape[1:]).swapaxes(0, 1)
        x = x.reshape(count, rows, *x.shape[3:])
        return x if rows_sharding is None else jax.lax.with_sharding_constraint(
            x, jax.sharding.NamedSharding(rows_sharding.mesh,
                                          jax.sharding.PartitionSpec(None,
                                                                     *rows_sharding.spec)))

    def join(x: jax.Array) -> jax.Array:
        if x.ndim < 2 or x.shape[1] != rows:
            raise ConfigError(
                f"{WHAT} runs the model micro-batch by micro-batch and joins the outputs "
                f"along the batch, so every output needs the batch as its first "
                f"dimension; one output has shape {tuple(x.shape[1:])} for a micro-batch "
                f"of {rows} rows (batch {batch}). Fix: return per-example outputs from "
                "the model and reduce them (e.g. the loss) in the step."
            )
        x = x.reshape(count, num_csx, micro_batch_size, *x.shape[2:]).swapaxes(0, 1)
        return x.reshape(batch, *x.shape[3:])

    whole, skeleton = split_inputs(args, kwargs)
    chunks = [split(x) for x in whole]

    def body(bufs: dict, inputs: tuple) -> tuple[dict, Any]:
        parts, m = inputs
        a, kw = combine(parts, skeleton)
        out, new = apply(params, bufs, a, kw, None if key is None else jax.random.fold_in(key, m))
        bufs = {n: new[n].astype(v.dtype) if n in new else v for n, v in bufs.items()}
        return bufs, out

    new_buffers, outs = jax.lax.scan(jax.checkpoint(body), dict(buffers),
                                     (chunks, jnp.arange(count)))
    return jax.tree.map(join, outs), new_buffers
