"""How one model call runs on a backend's layout: the single entry of model wrapping.

A compiled model hands its pure apply function (and, for pipeline mode, a way to get
its layers) to :func:`run_model`; the wafer layout decides how the call runs:

- pipeline mode: a GPipe or circular schedule over the stages, as the wafer's
  ``schedule`` says (:mod:`._pipeline`);
- weight-streaming mode: layer by layer, each layer's weights gathered just in time
  and the batch split over every device (:mod:`._streaming`), where the model gives
  its layers and the batch splits; otherwise as in the sharded layout below;
- weight-streaming or replica mode with a ``micro_batch_size``: the call over the
  micro-batches of each system, activations rematerialized (:mod:`._micro`);
- otherwise (replica and sharded mode), one call on the whole batch (XLA's SPMD
  partitioner places it on a mesh).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ConfigError
from ._micro import ApplyFn, micro_batched_apply
from ._pipeline import Layers, pipelined_apply
from ._streaming import streamed_apply

__all__ = ["run_model"]


def run_model(backend: Any, apply: ApplyFn, layers_for: Callable[[tuple, dict], Layers],
              params: dict, buffers: dict, args: tuple, kwargs: dict, *,
              key: Any) -> tuple[Any, dict]:
    """Runs ``apply(params, buffers, args, kwargs, key) -> (outputs, new_buffers)``.

    Args:
      backend: the compiled model's backend (its ``wafer``, ``layout`` and
        ``cluster_config`` choose the layout; a backend without a wafer runs one call).
      apply: the model's pure call.
      layers_for: ``layers_for(micro_args, micro_kwargs) -> Layers``, the model's layers
        for pipeline and weight-streaming mode (called only there).
      params, buffers, args, kwargs, key: the call's values.
    """
    wafer = getattr(backend, "wafer", None)
    cluster = getattr(backend, "cluster_config", None)
    if wafer is not None and wafer.mode == "pipeline":
        return pipelined_apply(layers_for, wafer, wafer.micro_batch_size, params, buffers,
                               args, kwargs, key=key)
    if (wafer is not None and wafer.mode == "weight_streaming"
            and getattr(cluster, "micro_batch_size", None) is None):
        streamed = streamed_apply(layers_for, backend.layout, params, buffers, args, kwargs,
                                  key=key)
        if streamed is not None:
            return streamed
    if (cluster is not None and cluster.micro_batch_size is not None
            and cluster.execution_mode != "pipeline"):
        layout = getattr(backend, "layout", None)
        _check_replica_micro_batch(cluster, layout)
        return micro_batched_apply(apply, cluster.micro_batch_size, cluster.num_csx, params,
                                   buffers, args, kwargs, key,
                                   None if layout is None else layout.batch)
    return apply(params, buffers, args, kwargs, key)


def _check_replica_micro_batch(cluster: Any, layout: Any) -> None:
    """In replica mode every micro-batch is split over the replicas."""
    if layout is None or cluster.execution_mode != "replica":
        return
    replicas = layout.wafer.inner_size
    if cluster.micro_batch_size % replicas:
        raise ConfigError(
            f"ClusterConfig(execution_mode='replica', num_replicas={replicas}, "
            f"micro_batch_size={cluster.micro_batch_size}): every micro-batch is "
            f"split over the replicas, so micro_batch_size must be a multiple of "
            f"num_replicas. Fix: set micro_batch_size to "
            f"{max(cluster.micro_batch_size // replicas, 1) * replicas}."
        )
