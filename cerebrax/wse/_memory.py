"""Per-device memory of a traced step on the wafer (or on one device), and the budget.

:func:`memory_report` compiles a step ahead of time and reads XLA's memory analysis of
the per-device program. :func:`check_memory_budget` turns a report into the
``ConfigError`` a run with ``ClusterConfig(device_memory=...)`` gets before it starts
when the layout does not fit.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from .. import _step
from .._filters import is_prng_key
from ..errors import ConfigError

__all__ = ["MemoryReport", "check_memory_budget", "memory_report", "report_for_compiled"]


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """Bytes per device. ``*_total_bytes`` are the unsharded sizes, for comparison.

    ``temp_bytes`` and the other ``xla_*`` fields come from XLA's compiled memory
    analysis of the per-device program (None where the platform gives none).
    ``peak_bytes`` bounds the largest live set of one device while the step runs:
    XLA's arguments plus its temporaries plus the outputs that do not reuse an
    argument's buffer (the state is donated, so a step's new state reuses the old).
    """

    num_devices: int
    mode: str
    params_bytes: int
    optimizer_bytes: int
    other_state_bytes: int
    params_total_bytes: int
    optimizer_total_bytes: int
    largest_param_bytes: int
    temp_bytes: int | None
    xla_argument_bytes: int | None
    xla_output_bytes: int | None
    peak_bytes: int | None = None

    @property
    def weight_and_optimizer_bytes(self) -> int:
        """Bytes per device of the parameters and the optimizer state together."""
        return self.params_bytes + self.optimizer_bytes

    def format(self) -> str:
        """The report as text in MiB, one line per quantity (also ``str(report)``)."""
        def mib(n: int | None) -> str:
            return "n/a" if n is None else f"{n / 2**20:.3f} MiB"

        rows = [
            f"memory per device ({self.num_devices} device(s), mode {self.mode})",
            f"  parameters:       {mib(self.params_bytes)} (of {mib(self.params_total_bytes)})",
            f"  optimizer state:  {mib(self.optimizer_bytes)} "
            f"(of {mib(self.optimizer_total_bytes)})",
            f"  other state:      {mib(self.other_state_bytes)}",
            f"  largest parameter: {mib(self.largest_param_bytes)}",
            f"  XLA temporaries:  {mib(self.temp_bytes)}",
            f"  XLA arguments:    {mib(self.xla_argument_bytes)}",
            f"  XLA outputs:      {mib(self.xla_output_bytes)}",
            f"  peak (arguments + temporaries + new outputs): {mib(self.peak_bytes)}",
        ]
        return "\n".join(rows)

    __str__ = format


def _optimizer_ref_ids() -> set[int]:
    ids = set()
    for opt in _step.live_optimizers():
        for value in vars(opt).values():
            if isinstance(value, _step.StateRef):
                ids.add(id(value))
    return ids


def _leaf_bytes(leaf: Any, sharding: Any = None) -> int:
    """Bytes of ``leaf``, or of one device's shard under ``sharding``."""
    if is_prng_key(leaf):
        leaf = jax.random.key_data(leaf)
    shape = tuple(leaf.shape)
    if sharding is not None and shape:
        shape = sharding.shard_shape(shape)
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize


def memory_report(step: Any, *args: Any, **kwargs: Any) -> MemoryReport:
    """Compiles ``step`` (a ``cstorch.trace`` step) for these inputs and reports memory.

    Nothing runs. State bytes are measured on the state as it is laid out for the
    backend's mesh (a multi-device CSX backend) or on its device.

    Example:
      On one device the state is held whole:

      >>> model = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
      >>> @cstorch.trace
      ... def train_step(x, y):
      ...     loss = torch.nn.functional.mse_loss(model(x), y)
      ...     cstorch.backward(loss)
      ...     optimizer.step()
      ...     return loss
      >>> report = cstorch.wse.memory_report(train_step, torch.ones(8, 4), torch.zeros(8, 2))
      >>> report.num_devices, report.mode, report.params_bytes   # 10 float32 weights
      (1, 'single device', 40)
      >>> print(report)             # in MiB, with XLA's temporaries and the peak
      memory per device (1 device(s), mode single device)
        parameters:       0.000 MiB (of 0.000 MiB)
      ...

      On the emulated wafer (8 CPU devices, ``XLA_FLAGS=--xla_force_host_platform_device_count=8``
      set before JAX starts), weight streaming shards the parameters and the optimizer
      state over the weight servers, and the report gives one device's share::

          backend = cstorch.backend("CSX", cluster_config=cstorch.distributed.ClusterConfig(
              max_wgt_servers=8))
          model = cstorch.compile(torch.nn.Sequential(
              torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)), backend)
          # ... optimizer and train_step as above
          report = cstorch.wse.memory_report(train_step, torch.ones(16, 64), torch.zeros(16, 8))
          report.num_devices, report.mode                 # (8, 'weight_streaming')
          report.params_bytes, report.params_total_bytes  # (9348, 74784): about 1/8
    """
    return report_for_compiled(step, step.lower(*args, **kwargs).compile())


def report_for_compiled(step: Any, compiled: Any) -> MemoryReport:
    """The report of ``step``, already compiled as ``compiled`` (``jax.stages.Compiled``)."""
    backend = step.backend
    wafer = getattr(backend, "wafer", None)
    opt_ids = _optimizer_ref_ids()
    params = optimizer = other = params_total = optimizer_total = largest = 0
    # The layout's shardings where the step has one (the state may not be placed yet:
    # a budget check runs before it is); else the devices the values are on.
    for ref, ref_shardings in step.state_layout():
        leaves = jax.tree.leaves(ref.stored)
        per_leaf = jax.tree.leaves(ref_shardings, is_leaf=lambda s: s is None)
        if len(per_leaf) != len(leaves):
            per_leaf = [None] * len(leaves)
        local = sum(_leaf_bytes(x, s) for x, s in zip(leaves, per_leaf))
        total = sum(_leaf_bytes(x) for x in leaves)
        if isinstance(ref, _step.Parameter):
            params += local
            params_total += total
            largest = max([largest] + [_leaf_bytes(x) for x in leaves])
        elif id(ref) in opt_ids:
            optimizer += local
            optimizer_total += total
        else:
            other += local
    analysis = compiled.memory_analysis()

    def field(name: str) -> int | None:
        value = getattr(analysis, name, None) if analysis is not None else None
        return None if value is None else int(value)

    return MemoryReport(
        num_devices=wafer.size if wafer is not None else 1,
        mode=wafer.mode if wafer is not None else "single device",
        params_bytes=params,
        optimizer_bytes=optimizer,
        other_state_bytes=other,
        params_total_bytes=params_total,
        optimizer_total_bytes=optimizer_total,
        largest_param_bytes=largest,
        temp_bytes=field("temp_size_in_bytes"),
        xla_argument_bytes=field("argument_size_in_bytes"),
        xla_output_bytes=field("output_size_in_bytes"),
        peak_bytes=_peak(field),
    )


def _peak(field: Any) -> int | None:
    """Arguments + temporaries + the outputs that do not reuse an argument's buffer."""
    parts = [field(n) for n in ("argument_size_in_bytes", "temp_size_in_bytes",
                                "output_size_in_bytes", "alias_size_in_bytes")]
    if parts[0] is None or parts[1] is None:
        return None
    args, temps, outs, alias = (p or 0 for p in parts)
    return args + temps + max(outs - alias, 0)


def check_memory_budget(report: MemoryReport, budget: int,
                        step_name: str = "step") -> None:
    """Raises ``ConfigError`` when one device's peak (see MemoryReport) exceeds ``budget``.

    The message gives the per-device breakdown and the layouts that would fit the
    parameters and optimizer state (weight streaming over more servers), computed from
    the report's totals (a starting point: the new layout's own compile is checked).
    """
    peak = report.peak_bytes
    if peak is None or peak <= budget:
        return
    state_total = report.params_total_bytes + report.optimizer_total_bytes
    fixes = []
    if state_total > 0:
        # Leave half of the budget for what does not shard (activations, temporaries):
        # a starting point, checked by this same analysis when the new layout compiles.
        servers = max(-(-2 * state_total // budget), 2)
        if report.mode not in ("weight_streaming", "sharded") or servers > report.num_devices:
            fixes.append(
                f"execution_mode='weight_streaming' with max_wgt_servers >= {servers} "
                f"(parameters and optimizer state split over the servers: "
                f"{_mib(state_total / servers)} of them per device)")
    fixes.append("a smaller batch, or ClusterConfig(micro_batch_size=...) so that each "
                 "model call holds fewer activations")
    fixes.append(f"a larger device_memory, if the devices have it (at least {_mib(peak)})")
    raise ConfigError(
        f"The traced step `{step_name}` needs {_mib(peak)} per device, more than "
        f"ClusterConfig(device_memory={_mib(budget)}) allows, in the "
        f"{report.mode!r} layout on {report.num_devices} device(s). Per device: "
        f"parameters {_mib(report.params_bytes)} (of {_mib(report.params_total_bytes)}), "
        f"optimizer state {_mib(report.optimizer_bytes)} "
        f"(of {_mib(report.optimizer_total_bytes)}), XLA temporaries "
        f"{_mib(report.temp_bytes)}, peak {_mib(peak)} (arguments + temporaries + new "
        f"outputs, from XLA's memory analysis of the compiled step; nothing ran). Fix: "
        + "; or ".join(fixes) + "."
    )


def _mib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:.2f} MiB"
