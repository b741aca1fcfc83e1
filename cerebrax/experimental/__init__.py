"""``cstorch.experimental``: cstorch's experimental wafer features. cerebrax has none of
them; the names exist so that code that imports them runs. Using one of these is an
:class:`~cerebrax.errors.UnsupportedOpError` that names the feature:

- ``start_implicit_loop`` / ``update_implicit_loop`` / ``get_loop_iteration_slice``:
  a generation loop compiled into the wafer program (cstorch's autoregressive
  inference);
- ``Compression``: compressed weight transfer.

``listener.register_traced_tensor_hook`` (hooks on the tensors of the traced graph) is
accepted and its hook never called (see :mod:`cerebrax.experimental.listener`).
"""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedOpError
from . import listener as listener

__all__ = ["Compression", "get_loop_iteration_slice", "listener", "start_implicit_loop",
           "update_implicit_loop"]


def unsupported(feature: str, fix: str) -> UnsupportedOpError:
    """The error for an experimental wafer feature cerebrax lacks."""
    return UnsupportedOpError(f"cstorch.experimental.{feature} is not supported by "
                              f"cerebrax. {fix}")


_LOOP_FIX = ("Run autoregressive generation in torch eager (model.eval() under "
             "torch.no_grad(), one token per forward call) instead of an implicit loop "
             "in the compiled step.")


def start_implicit_loop(*args: Any, **kwargs: Any) -> Any:
    """A generation loop compiled into the step: an error in cerebrax."""
    raise unsupported("start_implicit_loop", _LOOP_FIX)


def update_implicit_loop(*args: Any, **kwargs: Any) -> Any:
    """A generation loop compiled into the step: an error in cerebrax."""
    raise unsupported("update_implicit_loop", _LOOP_FIX)


def get_loop_iteration_slice(*args: Any, **kwargs: Any) -> Any:
    """A generation loop compiled into the step: an error in cerebrax."""
    raise unsupported("get_loop_iteration_slice", _LOOP_FIX)


class Compression:
    """Compressed weight transfer to the wafer: an error in cerebrax."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise unsupported("Compression", "Weights are not compressed in transfer; remove "
                          "the compression setting.")
