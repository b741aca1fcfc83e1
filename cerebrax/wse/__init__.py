"""The emulated wafer: a JAX device mesh built from the run's ``ClusterConfig``.

``num_csx`` systems form the outer, data-parallel mesh axis ``"csx"``. Inside a system
the execution mode picks the inner axis: ``"replica"`` (``num_replicas`` data-parallel
copies of the model), ``"wgt"`` (``max_wgt_servers`` weight servers that hold the
parameters and optimizer state sharded) or ``"stage"`` (``num_stages`` pipeline stages,
each holding a contiguous range of the model's layers; see :mod:`._pipeline`).

Weight-streaming mode runs the model call layer by layer in ``jax.shard_map``, the
batch split over every device, each layer's weights all-gathered just before its
forward and again in its backward pass, and its gradient reduce-scattered back to the
shards; identical consecutive layers run as one scan (see :mod:`._streaming`). A model
without layers, or a batch that does not split over all devices, runs as in the
sharded layout (``execution_mode="sharded"``): one global-view call whose collectives
XLA's SPMD partitioner inserts, as in replica mode. Pipeline mode runs the model call
as a GPipe or circular schedule in ``jax.shard_map`` (:mod:`._pipeline`). Outside pipeline mode a ``micro_batch_size``
runs the model call over micro-batches with rematerialized activations (see
:mod:`._micro`). :func:`run_model` is the one call through which a compiled model runs
on the layout; :func:`memory_report` and :func:`collective_report` read a compiled
step's per-device memory and collectives; :func:`check_memory_budget` is the refusal of
a step over ``ClusterConfig(device_memory=...)``.
"""

from ._cluster import EXECUTION_MODES, MODE_ALIASES, ClusterConfig
from ._collectives import (
    Collective as Collective,
    CollectiveReport as CollectiveReport,
    Loop as Loop,
    collective_report as collective_report,
    parse_collectives as parse_collectives,
)
from ._layout import Layout
from ._memory import MemoryReport, check_memory_budget, memory_report, report_for_compiled
from ._mesh import Wafer, build_wafer
from ._micro import micro_batched_apply
from ._pipeline import Layers, Stage, pipelined_apply, recording_schedule, split_layers
from ._run import run_model
from ._streaming import streamed_apply as streamed_apply

__all__ = ["EXECUTION_MODES", "MODE_ALIASES", "ClusterConfig", "Collective", "CollectiveReport",
           "Layers", "Layout", "Loop", "MemoryReport", "Stage", "Wafer", "build_wafer",
           "check_memory_budget", "collective_report", "memory_report",
           "micro_batched_apply", "parse_collectives", "pipelined_apply",
           "recording_schedule", "report_for_compiled", "run_model", "split_layers",
           "streamed_apply"]
