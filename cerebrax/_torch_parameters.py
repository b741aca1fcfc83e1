"""Torch parameters read inside a traced step: the torch function mode behind
``TraceContext``'s live parameters (see ``_trace_context._live_torch_parameters``).

Only imported where torch is (a compiled torch module exists)."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

from torch_bridge import stand_in

from ._runtime import RUNTIME

__all__ = ["ParameterReads"]

# Attribute access that concerns the parameter object itself, not its value: torch
# routes property getters and setters (``p.grad``, ``p.requires_grad``, ``p.shape``)
# through the mode as ``__get__``/``__set__``; of those only ``p.data`` reads the value.
_OBJECT_ACCESS = ("__get__", "__set__", "__delete__")
_DATA = torch.Tensor.data.__get__


class ParameterReads(TorchFunctionMode):
    """Gives torch calls a stand-in for each of ``aliases``' torch parameters.

    Args:
      aliases: ``(torch parameter, cerebrax Parameter)`` pairs; the stand-in of a torch
        parameter reads and writes the cerebrax parameter's ``value``.
    """

    def __init__(self, aliases: list[tuple[Any, Any]]):
        super().__init__()
        # One stand-in per torch parameter, so that views of it alias one another; the
        # compiled Parameter (what optimizer.param_groups holds) maps to the same one.
        self._stand_ins: dict[int, tuple[Any, Any]] = {}
        self._views: dict[Any, Any] = {}
        for original, p in aliases:
            tensor = self._views.get(p)
            if tensor is None:
                tensor = self._views[p] = stand_in(p, original)
                self._stand_ins[id(p)] = (p, tensor)
            self._stand_ins[id(original)] = (original, tensor)

    def __enter__(self) -> ParameterReads:
        RUNTIME.torch_views = self._views
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        RUNTIME.torch_views = {}
        super().__exit__(*exc)

    def _stand_in_of(self, x: Any) -> Any:
        found = self._stand_ins.get(id(x))
        if found is not None and found[0] is x:
            return found[1]
        return x

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if torch.compiler.is_exporting() or (
                getattr(func, "__name__", None) in _OBJECT_ACCESS and func is not _DATA):
            return func(*args, **kwargs)
        args, kwargs = pytree.tree_map(self._stand_in_of, (args, kwargs))
        return func(*args, **kwargs)
