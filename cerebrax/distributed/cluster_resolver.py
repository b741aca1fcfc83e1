"""``cstorch.distributed.cluster_resolver``: who is who among the streaming workers.

``TaskSpec`` describes one streaming worker (its global rank, its rank among the workers
of its system, its system), ``ClusterSpec`` all of them; :func:`service_resolver`
answers for the worker that calls it, from the backend's ``ClusterConfig`` (one task,
rank 0 of 1, without CSX workers), as :mod:`cerebrax.distributed`'s other helpers do.
"""

from __future__ import annotations

import dataclasses
import socket

from ..data._streamers import current_info

__all__ = ["ClusterSpec", "ServiceResolver", "TaskSpec", "service_resolver"]


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One streaming worker: global ``rank``, ``local_rank`` among the workers of its
    system, ``wse_id`` (its system), and the host it runs on."""

    rank: int
    local_rank: int
    wse_id: int
    node_name: str = "unknown"


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """Every streaming worker (``tasks``, by rank), the ``rank`` of the caller's task,
    the number of systems and of workers per system."""

    tasks: list
    rank: int
    num_csx: int
    num_workers_per_csx: int

    def task(self, rank: int | None = None) -> TaskSpec:
        """The task of ``rank`` (default: the caller's)."""
        return self.tasks[self.rank if rank is None else rank]

    @property
    def num_tasks(self) -> int:
        """The number of streaming workers (``len(tasks)``); unlike
        :func:`cerebrax.distributed.num_tasks`, it does not count the user node."""
        return len(self.tasks)


@dataclasses.dataclass(frozen=True)
class ServiceResolver:
    """What :func:`service_resolver` returns: the ``cluster_spec`` of the run."""

    cluster_spec: ClusterSpec


def service_resolver() -> ServiceResolver:
    """The cluster as the calling streaming worker sees it.

    Example:
      >>> import cerebrax as cstorch
      >>> spec = cstorch.distributed.service_resolver().cluster_spec
      >>> spec.task().rank, spec.num_csx, spec.num_workers_per_csx
      (0, 1, 1)
    """
    info = current_info()
    node = socket.gethostname()
    per = info.workers_per_csx
    tasks = [TaskSpec(rank=r, local_rank=r % per, wse_id=r // per, node_name=node)
             for r in range(info.num_streamers)]
    return ServiceResolver(ClusterSpec(tasks, info.rank, info.num_csx, per))
