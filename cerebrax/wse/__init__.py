"""The emulated wafer: a JAX device mesh built from the run's ``ClusterConfig``.

``num_csx`` systems form the outer, data-parallel mesh axis ``"csx"``. Inside a system
the execution mode picks the inner axis: ``"replica"`` (``num_replicas`` data-parallel
copies of the model) or ``"wgt"`` (``max_wgt_servers`` weight servers that hold the
parameters and optimizer state sharded). The traced step is jitted with the layout's
shardings and XLA's SPMD partitioner inserts the collectives.
"""

from ._layout import Layout
from ._memory import MemoryReport, memory_report
from ._mesh import Wafer, build_wafer

__all__ = ["Layout", "MemoryReport", "Wafer", "build_wafer", "memory_report"]
