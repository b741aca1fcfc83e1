"""``cerebras.appliance.cluster.client``: cerebrax's minimal stand-in for the cluster client
of Cerebras' appliance package, present only under the cstorch alias: only
:class:`TelemetryClient`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["TelemetryClient"]


class TelemetryClient:
    """Where Model Zoo pushes run metrics for the cluster's dashboards (Grafana).

    cerebrax has no cluster and no telemetry server, so a push is checked and dropped:
    nothing is recorded or sent. Used as Model Zoo does::

        with TelemetryClient(mgmt_client, max_buffer_size=5) as client:
            client.push(metrics={"auto_restart_job": 1}, labels={"job_id": "..."})

    Args:
      mgmt_client: the cluster's management client (kept, unused).
      max_buffer_size, max_buffer_seconds: how many metrics, and how long, the real client
        buffers before it sends (kept, unused).
    """

    def __init__(self, mgmt_client: Any = None, max_buffer_size: int = 128,
                 max_buffer_seconds: float = 150) -> None:
        self.mgmt_client = mgmt_client
        self.max_buffer_size = max_buffer_size
        self.max_buffer_seconds = max_buffer_seconds

    def __enter__(self) -> TelemetryClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def push(self, metrics: Mapping[str, Any], labels: Mapping[str, Any] | None = None
             ) -> None:
        """Drops ``metrics`` (name -> value) with their ``labels`` (name -> value).

        Raises:
          TypeError: ``metrics`` or ``labels`` is not a mapping.
        """
        for what, value in (("metrics", metrics), ("labels", labels or {})):
            if not isinstance(value, Mapping):
                raise TypeError(f"TelemetryClient.push: {what} must be a mapping of names "
                                f"to values, got {type(value).__name__}.")
