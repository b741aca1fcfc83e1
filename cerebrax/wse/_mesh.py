"""The device mesh of a CSX backend, from its ``ClusterConfig``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from ._cluster import ClusterConfig
from ..errors import ConfigError

__all__ = ["Wafer", "build_wafer"]

# cstorch's default max_wgt_servers; a config that keeps it asks for no particular count.
_DEFAULT_WGT_SERVERS = ClusterConfig.max_wgt_servers


@dataclasses.dataclass(frozen=True)
class Wafer:
    """A mesh ``(num_csx, inner)`` with axes ``("csx", "replica" | "wgt" | "stage")``.

    ``micro_batch_size`` is the pipeline's micro-batch (None: ``num_stages``
    micro-batches per system); it is None in the other modes. ``schedule`` and
    ``repeats`` are the pipeline's ``ClusterConfig.pipeline_schedule`` and
    ``pipeline_repeats`` (pipeline mode only).
    """

    mesh: Mesh
    mode: str
    micro_batch_size: int | None = None
    schedule: str = "gpipe"
    repeats: int | None = None

    @property
    def inner_axis(self) -> str:
        """The name of the mesh's second axis: ``"replica"``, ``"wgt"`` or ``"stage"``."""
        return self.mesh.axis_names[1]

    @property
    def num_csx(self) -> int:
        """The number of systems (the size of the ``"csx"`` axis)."""
        return self.mesh.shape["csx"]

    @property
    def inner_size(self) -> int:
        """The size of :attr:`inner_axis`: devices per system."""
        return self.mesh.shape[self.inner_axis]

    @property
    def data_axes(self) -> tuple[str, ...]:
        """The mesh axes the batch is split over."""
        return ("csx", "replica") if self.mode == "replica" else ("csx",)

    @property
    def data_parallel_size(self) -> int:
        """The number of devices the batch is split over (the product of :attr:`data_axes`)."""
        return int(np.prod([self.mesh.shape[a] for a in self.data_axes]))

    @property
    def size(self) -> int:
        """The number of devices of the mesh."""
        return self.mesh.size

    def __repr__(self) -> str:
        shape = ", ".join(f"{k}={v}" for k, v in self.mesh.shape.items())
        return f"Wafer({self.mode!r}, {shape})"


def build_wafer(cluster: ClusterConfig,
                devices: Sequence[jax.Device] | None = None) -> Wafer | None:
    """The wafer mesh for ``cluster``, or None when the run uses one device.

    With several devices visible, ``num_csx`` x (``num_replicas`` | ``max_wgt_servers``
    | ``num_stages``) devices form the mesh and must fit. An unchanged default
    ``max_wgt_servers`` (24) that does not fit means one device per system;
    ``num_stages=None`` means one stage.

    Raises:
      ConfigError: the layout needs more devices than there are.
    """
    devices = list(jax.devices() if devices is None else devices)
    available = len(devices)
    if available == 1:
        # One device (a laptop, a plain CPU run): every ClusterConfig runs on it, so a
        # script written for a real cluster ports unchanged. Emulate a wafer with
        # XLA_FLAGS=--xla_force_host_platform_device_count=N.
        return None
    mode = cluster.execution_mode
    csx = cluster.num_csx
    if mode == "pipeline":
        inner, axis, field = (cluster.num_stages or 1), "stage", "num_stages"
    elif mode == "replica":
        inner, axis, field = (cluster.num_replicas or 1), "replica", "num_replicas"
    else:
        inner, axis, field = cluster.max_wgt_servers, "wgt", "max_wgt_servers"
        if inner == _DEFAULT_WGT_SERVERS and csx * inner > available:
            # The default (cstorch's 24) is not a request for 24 devices: without an
            # explicit max_wgt_servers that fits, each system keeps its weights on one
            # device (set max_wgt_servers to shard them).
            inner = 1
    needed = csx * inner
    if needed > available:
        fix_inner = max(available // csx, 1)
        raise ConfigError(
            f"ClusterConfig(execution_mode={mode!r}, num_csx={csx}, {field}={inner}) needs "
            f"num_csx x {field} = {csx} x {inner} = {needed} devices, but JAX sees "
            f"{available}. Fix: lower {field} to {fix_inner}"
            + (f" or num_csx to {max(available // inner, 1)}" if inner <= available else "")
            + " (or emulate more CPU devices with "
            "XLA_FLAGS=--xla_force_host_platform_device_count=N before JAX starts)."
        )
    if needed == 1:
        return None
    grid = np.array(devices[:needed], dtype=object).reshape(csx, inner)
    if mode == "pipeline":
        return Wafer(Mesh(grid, ("csx", axis)), mode, cluster.micro_batch_size,
                     cluster.pipeline_schedule, cluster.pipeline_repeats)
    return Wafer(Mesh(grid, ("csx", axis)), mode)
