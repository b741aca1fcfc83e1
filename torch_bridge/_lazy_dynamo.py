"""torch's Python kernels without an import of ``torch._dynamo`` that nothing uses.

torch marks many of its Python kernels as functions Dynamo must not trace with
``torch._disable_dynamo``: the elementwise references of ``torch._refs`` that serve as
meta kernels (``linalg.vector_norm``, which ``clip_grad_norm_`` calls, is one), and
some decompositions. The mark is made lazily: the first call of such a kernel imports
``torch._dynamo`` (0.6 to 1.3 s, with sympy and ``torch.distributed.tensor``) to build
its disabled version, then calls that. torch_bridge asks torch's meta kernels for every
op's result shapes, so the first traced step of a process would pay that import even
where nothing ever calls ``torch.compile``.

A disabled function differs from its function only while a Dynamo frame hook is
installed, and no hook exists before ``torch._dynamo`` is imported. :func:`defer` gives
each marked kernel a stand-in (:class:`_UntilDynamo`) in the attribute torch's wrapper
caches the disabled version in. The stand-in calls the kernel itself while
``torch._dynamo`` is not imported. Once it is, the stand-in removes itself and hands the
call back to torch's wrapper, which makes and caches torch's own disabled function as it
would have at its first call. Nothing about the kernel's result changes, only when the
import happens.

The kernels are found by walking torch's modules, their functions' ``__wrapped__``
chains and closures, and the decomposition tables. A marked kernel the walk misses
imports ``torch._dynamo`` at its first call, as before.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch

from cerebrax._runtime import RUNTIME

__all__ = ["defer", "defer_function"]

_ATTRIBUTE = "__dynamo_disable"  # where torch's wrapper caches the disabled function
# Exact type checks: ``isinstance`` reads ``__class__``, which some of torch's module
# attributes answer with a deprecation warning.
_FUNCTION = types.FunctionType


class _UntilDynamo:
    """Stands for ``torch._dynamo.disable(fn)`` until ``torch._dynamo`` is imported."""

    __slots__ = ("_fn", "_wrapper")

    def __init__(self, fn: types.FunctionType, wrapper: types.FunctionType):
        self._fn, self._wrapper = fn, wrapper

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if "torch._dynamo" not in sys.modules:
            return self._fn(*args, **kwargs)
        if vars(self._fn).get(_ATTRIBUTE) is self:
            delattr(self._fn, _ATTRIBUTE)
        return self._wrapper(*args, **kwargs)


def defer() -> None:
    """Gives torch's Dynamo-disabled Python kernels their stand-ins (once per process;
    nothing when ``torch._dynamo`` is imported already, or torch has no such wrapper)."""
    if RUNTIME.dynamo_deferred:
        return
    RUNTIME.dynamo_deferred = True
    code = _wrapper_code()
    if code is None:
        return
    for wrapper in _marked(code):
        _stand_in(wrapper, code)


def defer_function(wrapper: Any) -> None:
    """:func:`defer` for one function made by torch's ``_disable_dynamo`` that torch's
    modules do not hold (the ``__torch_dispatch__`` of a ``TorchDispatchMode``
    subclass, which torch marks as the class is made); anything else is left as it is."""
    code = _wrapper_code()
    if code is not None and type(wrapper) is _FUNCTION and wrapper.__code__ is code:
        _stand_in(wrapper, code)


def _wrapper_code() -> types.CodeType | None:
    """The code of the functions torch's ``_disable_dynamo`` makes; None where
    ``torch._dynamo`` is imported already, or torch has no such wrapper."""
    if "torch._dynamo" in sys.modules:
        return None
    make = getattr(getattr(torch, "_compile", None), "_disable_dynamo", None)
    if make is None:
        return None
    code = make(lambda: None).__code__
    if not {"fn"} <= set(code.co_freevars):
        return None  # a torch whose wrapper is not the one this module knows
    return code


def _stand_in(wrapper: types.FunctionType, code: types.CodeType) -> None:
    fn = wrapper.__closure__[code.co_freevars.index("fn")].cell_contents
    if type(fn) is _FUNCTION and _ATTRIBUTE not in vars(fn):
        setattr(fn, _ATTRIBUTE, _UntilDynamo(fn, wrapper))


def _marked(code: types.CodeType) -> list[types.FunctionType]:
    """The functions made by torch's ``_disable_dynamo`` (whose code is ``code``) that
    torch's modules and decomposition tables reach."""
    found: dict[int, types.FunctionType] = {}
    seen: set[int] = set()
    stack: list[Any] = []
    for name, module in list(sys.modules.items()):
        if name != "torch" and not name.startswith("torch."):
            continue
        try:
            values = list(vars(module).values())
        except TypeError:  # not a module: an object a library put in sys.modules
            continue
        stack.extend(v for v in values if type(v) is _FUNCTION)
    decomp = sys.modules.get("torch._decomp")
    if decomp is not None:
        tables = [getattr(decomp, "meta_table", {}), getattr(decomp, "decomposition_table", {})]
        tables += list(getattr(decomp, "global_decomposition_table", {}).values())
        for table in tables:
            stack.extend(v for v in table.values() if type(v) is _FUNCTION)
    while stack:
        f = stack.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        if f.__code__ is code:
            found[id(f)] = f
        inner = vars(f).get("__wrapped__")
        if type(inner) is _FUNCTION:
            stack.append(inner)
        for cell in f.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if type(value) is _FUNCTION:
                stack.append(value)
    return list(found.values())
