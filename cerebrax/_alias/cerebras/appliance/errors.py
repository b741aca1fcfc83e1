"""``cerebras.appliance.errors``: cerebrax's minimal stand-in for the exceptions of Cerebras'
appliance package, present only under the cstorch alias.

Model Zoo raises :class:`ApplianceNanError` itself (a NaN or inf loss, a loss scale that
stopped recovering) and, in its restartable trainer, tells a failed run's cause by these
classes. Each takes a message, like :class:`Exception`, and pickles (a child process sends
its exception to the parent).
"""

from __future__ import annotations

__all__ = [
    "ApplianceClientException",
    "ApplianceCompilationError",
    "ApplianceDeadlockError",
    "ApplianceNanError",
    "ApplianceUnknownError",
    "ClusterJobCancelledByCsctl",
]


class ApplianceClientException(Exception):
    """Base class of the appliance's errors."""


class ApplianceCompilationError(ApplianceClientException):
    """The model did not compile."""


class ApplianceDeadlockError(ApplianceClientException):
    """The run stalled (a deadlock on the cluster)."""


class ApplianceNanError(ApplianceClientException):
    """A NaN or inf value was found in the run's outputs."""


class ApplianceUnknownError(ApplianceClientException):
    """The run failed for a reason the appliance does not know."""


class ClusterJobCancelledByCsctl(ApplianceClientException):
    """The cluster job was cancelled from outside (``csctl cancel job``)."""
