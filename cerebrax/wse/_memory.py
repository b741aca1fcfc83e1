"""Per-device memory of a traced step on the wafer (or on one device)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from .. import _state

__all__ = ["MemoryReport", "memory_report", "report_for_compiled"]


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """Bytes per device. ``*_total_bytes`` are the unsharded sizes, for comparison.

    ``temp_bytes`` and the other ``xla_*`` fields come from XLA's compiled memory
    analysis of the per-device program (None where the platform gives none).
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

    @property
    def weight_and_optimizer_bytes(self) -> int:
        return self.params_bytes + self.optimizer_bytes

    def format(self) -> str:
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
        ]
        return "\n".join(rows)

    __str__ = format


def _optimizer_ref_ids() -> set[int]:
    ids = set()
    for opt in _state.live_optimizers():
        for value in vars(opt).values():
            if isinstance(value, _state.StateRef):
                ids.add(id(value))
    return ids


def _leaf_bytes(leaf: Any, per_device: bool) -> int:
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
    shape = tuple(leaf.shape)
    sharding = getattr(leaf, "sharding", None)
    if per_device and shape and sharding is not None:
        shape = sharding.shard_shape(shape)
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize


def memory_report(step: Any, *args: Any, **kwargs: Any) -> MemoryReport:
    """Compiles ``step`` (a ``cstorch.trace`` step) for these inputs and reports memory.

    Nothing runs. State bytes are measured on the state as it is laid out for the
    backend's mesh (a multi-device CSX backend) or on its device.

    Example:
      >>> report = cstorch.wse.memory_report(train_step, x, y)   # doctest: +SKIP
      >>> print(report)                                          # doctest: +SKIP
    """
    return report_for_compiled(step, step.lower(*args, **kwargs).compile())


def report_for_compiled(step: Any, compiled: Any) -> MemoryReport:
    """The report of ``step``, already compiled as ``compiled`` (``jax.stages.Compiled``)."""
    backend = step._backend
    wafer = getattr(backend, "wafer", None)
    opt_ids = _optimizer_ref_ids()
    params = optimizer = other = params_total = optimizer_total = largest = 0
    for ref in step._refs:
        leaves = jax.tree.leaves(ref._value)
        local = sum(_leaf_bytes(x, True) for x in leaves)
        total = sum(_leaf_bytes(x, False) for x in leaves)
        if isinstance(ref, _state.Parameter):
            params += local
            params_total += total
            largest = max([largest] + [_leaf_bytes(x, False) for x in leaves])
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
    )
