"""The wafer mesh across processes: starting JAX's multi-process runtime.

:func:`initialize` (``cstorch.distributed.initialize``) joins this process to JAX's own
multi-process runtime (``jax.distributed.initialize``; CPU devices talk through gloo).
Afterwards ``jax.devices()`` lists the devices of every process, a CSX backend builds
its mesh over them, and an array laid out on that mesh is only partly held by each
process. Every process runs the same script; how values are placed on such a mesh
and read back is :mod:`cerebrax._placement`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import jax

from .._filters import check_int, is_strict_int
from .._runtime import RUNTIME
from ..errors import BackendError, ConfigError

__all__ = ["get_rank", "get_world_size", "initialize", "shutdown"]

MSG_TOO_LATE = """\
cstorch.distributed.initialize() must run before JAX starts its devices, but {what}.
Call it first thing in the script, right after the imports: before cstorch.backend(),
before building the model, before any JAX computation (even jax.devices()):

    import cerebrax as cstorch
    cstorch.distributed.initialize("10.0.0.1:1234", num_processes=2, process_id=RANK)
    backend = cstorch.backend("CSX", cluster_config=...)"""

MSG_CONNECT = """\
cstorch.distributed.initialize({address!r}, num_processes={n}, process_id={rank}) could
not join the other processes: {error}
Fix: start all {n} processes within initialization_timeout seconds, each with the same
coordinator_address and num_processes and its own process_id in 0..{last}; process 0
listens on the address's port, which must be free there and reachable from the others."""

_ADDRESS = re.compile(r"^(\[[0-9a-fA-F:]+\]|[^:\s]+):(\d{1,5})$")


# ---- starting ---------------------------------------------------------------------------
def initialize(
    coordinator_address: str,
    num_processes: int,
    process_id: int,
    *,
    local_device_ids: Sequence[int] | None = None,
    cpu_collectives: str = "gloo",
    initialization_timeout: int = 300,
    heartbeat_timeout_seconds: int = 100,
) -> None:
    """Joins this process to a multi-process run, so that one wafer mesh spans them all.

    Every process of the run calls this once, before anything else touches JAX, with
    the same ``coordinator_address`` and ``num_processes`` and its own ``process_id``.
    It starts JAX's own multi-process runtime (``jax.distributed.initialize``) with
    ``cpu_collectives`` for the collectives between CPU devices of different processes
    (GPUs and TPUs use their own). Afterwards a CSX backend whose ``ClusterConfig``
    asks for the devices of all processes (e.g. 2 processes x 4 devices and
    ``num_replicas=8``) lays its mesh over all of them.

    Every process then runs the same script: it passes the same GLOBAL batch to each
    step (each process copies only the rows its devices hold), step closures run on
    every process with the same values, and reading a value split over several
    processes (``model.state_dict()`` in weight streaming) is a collective that every
    process must make. Write files on one process only (``jax.process_index() == 0``).

    Args:
      coordinator_address: ``"host:port"`` of process 0, which listens on that port.
      num_processes: how many processes take part.
      process_id: this process's rank, ``0 <= process_id < num_processes``.
      local_device_ids: restricts this process to these local devices (accelerators).
      cpu_collectives: ``"gloo"`` (built in) or ``"mpi"`` (needs an MPI library).
      initialization_timeout: seconds to wait for all processes to join.
      heartbeat_timeout_seconds: seconds of silence after which a process counts as dead.

    Raises:
      ConfigError: an argument is invalid.
      BackendError: JAX has started already, this was called twice, or the processes
        could not join.

    Example:
      A run of 2 processes with 4 emulated CPU devices each starts the same script
      twice, ``RANK=0 python train.py & RANK=1 python train.py``, with
      ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` in the environment::

          import os
          import cerebrax as cstorch
          cstorch.distributed.initialize("localhost:4321", num_processes=2,
                                         process_id=int(os.environ["RANK"]))
          backend = cstorch.backend("CSX", cluster_config=cstorch.distributed.ClusterConfig(
              execution_mode="replica", num_replicas=8))   # one mesh over both processes
          cstorch.distributed.get_rank(), cstorch.distributed.get_world_size()  # (RANK, 2)
          ...  # the same model, steps and global batches in every process

      Without the call a process is a run of one:

      >>> cstorch.distributed.get_rank(), cstorch.distributed.get_world_size()
      (0, 1)

      and once JAX has started its devices it is too late to join a run:

      >>> devices = jax.devices()                # JAX starts its devices
      >>> cstorch.distributed.initialize("localhost:4321", num_processes=2, process_id=0)
      Traceback (most recent call last):
      ...
      cerebrax.errors.BackendError: cstorch.distributed.initialize() must run before JAX
      starts its devices, but JAX's devices are already in use in this process. ...
    """
    _check_arguments(coordinator_address, num_processes, process_id, cpu_collectives)
    if jax.distributed.is_initialized():
        raise BackendError(
            "cstorch.distributed.initialize() was already called in this process; it "
            "joins the run once. Remove the second call."
        )
    _check_not_started()
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    try:
        jax.distributed.initialize(
            coordinator_address, num_processes, process_id,
            local_device_ids=local_device_ids,
            initialization_timeout=initialization_timeout,
            heartbeat_timeout_seconds=heartbeat_timeout_seconds,
        )
    except Exception as e:  # the runtime's own errors: XlaRuntimeError, RuntimeError
        raise BackendError(MSG_CONNECT.format(
            address=coordinator_address, n=num_processes, rank=process_id,
            last=num_processes - 1, error=str(e).strip().splitlines()[0] if str(e) else e,
        )) from e


def shutdown() -> None:
    """Leaves the multi-process run (waits for the other processes to leave too).

    Called at exit by itself; nothing happens when the run was not initialized.
    """
    jax.distributed.shutdown()


def get_rank() -> int:
    """This process's index among the processes of the run (0 in a one-process run)."""
    return jax.process_index()


def get_world_size() -> int:
    """The number of processes of the run (1 unless :func:`initialize` joined several)."""
    return jax.process_count()


def _check_arguments(address: Any, n: Any, rank: Any, collectives: Any) -> None:
    if not isinstance(address, str) or not _ADDRESS.match(address):
        raise ConfigError(
            f"coordinator_address must be 'host:port' (e.g. 'localhost:4321' or "
            f"'10.0.0.1:4321'), got {address!r}."
        )
    check_int("num_processes", n, ge=1)
    if not is_strict_int(rank) or not 0 <= rank < n:
        raise ConfigError(
            f"process_id must be an integer in 0..{n - 1} (num_processes={n}), got "
            f"{rank!r}. Give every process its own rank."
        )
    if collectives not in ("gloo", "mpi"):
        raise ConfigError(
            f"cpu_collectives must be 'gloo' or 'mpi', got {collectives!r}."
        )


def _check_not_started() -> None:
    if RUNTIME.backend is not None:
        raise BackendError(MSG_TOO_LATE.format(
            what=f"a {RUNTIME.backend.backend_type} backend exists already"))
    # JAX's own test (the public initialize raises a RuntimeError for the same case).
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        raise BackendError(MSG_TOO_LATE.format(
            what="JAX's devices are already in use in this process"))


