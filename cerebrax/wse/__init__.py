"""The emulated wafer: a JAX device mesh built from the run's ``ClusterConfig``.

``num_csx`` systems form the outer, data-parallel mesh axis ``"csx"``. Inside a system
the execution mode picks the inner axis: ``"replica"`` (``num_replicas`` data-parallel
copies of the model), ``"wgt"`` (``max_wgt_servers`` weight servers that hold the
parameters and optimizer state sharded) or ``"stage"`` (``num_stages`` pipeline stages,
each holding a contiguous range of the model's layers; see :mod:`._pipeline`). The
traced step is jitted with the layout's shardings and XLA's SPMD partitioner inserts
the collectives; pipeline mode runs the model call as a GPipe schedule in
``jax.shard_map``. Outside pipeline mode a ``micro_batch_size`` runs the model call
over micro-batches with rematerialized activations (see :mod:`._micro`).
:func:`run_model` is the one call through which a compiled model runs on the layout.
"""

from ._cluster import EXECUTION_MODES, MODE_ALIASES, ClusterConfig
from ._layout import Layout
from ._memory import MemoryReport, memory_report, report_for_compiled
from ._mesh import Wafer, build_wafer
from ._micro import micro_batched_apply
from ._pipeline import Layers, Stage, pipelined_apply, split_layers
from ._run import run_model

__all__ = ["EXECUTION_MODES", "MODE_ALIASES", "ClusterConfig", "Layers", "Layout", "MemoryReport", "Stage", "Wafer", "build_wafer",
           "memory_report", "micro_batched_apply", "pipelined_apply", "report_for_compiled",
           "run_model",
           "split_layers"]
