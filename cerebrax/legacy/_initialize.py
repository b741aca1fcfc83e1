"""``cbtorch.initialize``: the backend of a 1.2-era script."""

from __future__ import annotations

from typing import Any

from ..backend import Backend, backend, current_backend
from ..errors import BackendError

__all__ = ["initialize"]


def initialize(cs_ip: str | None = None, *, backend_type: str | None = None,
               **backend_options: Any) -> Backend:
    """Creates the backend that the Session's steps run on (seed 003's first addition).

    Args:
      cs_ip: the address of the Cerebras system. cerebrax emulates the wafer on local
        JAX devices, so no address is contacted: giving one selects the ``"CSX"``
        backend (the emulated wafer, with its default mixed precision), leaving it out
        selects ``"CPU"``.
      backend_type: ``"CPU"``, ``"GPU"`` or ``"CSX"``, overriding the choice above.
      **backend_options: passed to :func:`cerebrax.backend` (``artifact_dir``,
        ``cluster_config``, ``allow_recompile``, ...).

    Returns:
      The :class:`cerebrax.Backend`. Calling ``initialize`` again with the same choice
      and no options returns the existing backend.

    Example:
      >>> import cerebrax.legacy as cbtorch
      >>> cbtorch.initialize()            # a CPU run
      Backend('CPU', device=...)
      >>> cbtorch.initialize() is cbtorch.initialize()  # the same backend again
      True
    """
    kind = (backend_type or ("CSX" if cs_ip else "CPU")).upper()
    existing = current_backend(raise_exception=False)
    if existing is not None and existing.backend_type == kind and not backend_options:
        return existing
    if existing is not None:
        raise BackendError(
            f"cbtorch.initialize() asks for a {kind} backend, but a "
            f"{existing.backend_type} backend exists already. Call initialize() once, "
            "at the top of the script, before cbtorch.module()."
        )
    return backend(kind, **backend_options)
