"""Constructor signatures with real annotations, evaluated when first inspected.

cerebrax's modules use ``from __future__ import annotations``: an annotation is kept as
its text, and ``inspect.signature(SGD.__init__)`` shows ``lr: 'float'``. Tools that build a
config class from a constructor need the objects. Cerebras' Model Zoo builds a pydantic
model from the signature of every cstorch optimizer and scheduler: it looks each
annotation up in a mapping keyed by annotation (``ParamsT``, ``torch.optim.Optimizer``)
and hands the others to pydantic, which cannot read ``'Mapping[str, Any]'`` without the
module's names.

:func:`resolve_on_inspection` gives a class's ``__init__`` a ``__signature__``, which
``inspect.signature`` returns before looking at anything else (Python 3.11 to 3.13, for
the function, a class, a bound method and a ``functools.wraps`` wrapper alike; for a class
or a bound method it drops ``self`` with ``Signature.replace``). The annotations are
evaluated when the signature is first read, not when the class is made, so an annotation
may name a module cerebrax does not import itself: torch is optional and slow to import,
and is imported only then (see ``_annotation_names`` in ``_base``). :func:`as_written`
reads the parameters without evaluating anything, for code that needs only their names
and defaults.

Example:
  >>> import inspect
  >>> from cerebrax.schedules._signature import as_written
  >>> inspect.signature(cstorch.optim.SGD.__init__).parameters["lr"].annotation
  <class 'float'>
  >>> as_written(cstorch.optim.SGD.__init__).parameters["lr"].annotation
  'float'
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["as_written", "resolve_on_inspection"]


def _no_names() -> Mapping[str, Any]:
    return {}


class _DeferredSignature(inspect.Signature):
    """An ``inspect.Signature`` whose parameters are computed when first read.

    Created with ``resolve`` it holds nothing but that function: the base class keeps the
    parameters and the return annotation in slots, and the first read of an unset slot
    reaches :meth:`__getattr__`, which fills both from ``resolve()``. Created as a plain
    signature (``Signature.replace`` and unpickling call ``type(self)(parameters, ...)``)
    it is one.
    """

    __slots__ = ("_resolve", "_written")

    def __init__(self, parameters: Any = None, *,
                 return_annotation: Any = inspect.Signature.empty,
                 __validate_parameters__: bool = True,
                 written: inspect.Signature | None = None,
                 resolve: Callable[[], inspect.Signature] | None = None) -> None:
        if resolve is None:
            super().__init__(parameters, return_annotation=return_annotation,
                             __validate_parameters__=__validate_parameters__)
        else:
            self._written, self._resolve = written, resolve

    def __getattr__(self, name: str) -> Any:
        if name not in ("_parameters", "_return_annotation"):
            raise AttributeError(name)
        resolved = self._resolve()
        super().__init__(resolved.parameters.values(),
                         return_annotation=resolved.return_annotation,
                         __validate_parameters__=False)
        return object.__getattribute__(self, name)

    def __repr__(self) -> str:
        return f"<Signature {self}>"  # as inspect.Signature's


def _evaluated(annotation: Any, globalns: dict[str, Any], names: Mapping[str, Any]) -> Any:
    """The object an annotation's text names, or the text where the module cannot name it
    (a user's subclass may annotate with names it imports only for type checkers)."""
    if not isinstance(annotation, str):
        return annotation
    try:
        return eval(annotation, globalns, dict(names))  # the module's own text, as typing does
    except (NameError, AttributeError, TypeError, SyntaxError):
        return annotation  # as inspect.signature gives it


def _resolved(function: Callable[..., Any], written: inspect.Signature,
              names: Callable[[], Mapping[str, Any]]) -> inspect.Signature:
    globalns = inspect.unwrap(function).__globals__
    extra = names()
    parameters = [p.replace(annotation=_evaluated(p.annotation, globalns, extra))
                  for p in written.parameters.values()]
    return inspect.Signature(
        parameters, return_annotation=_evaluated(written.return_annotation, globalns, extra))


def resolve_on_inspection(cls: type,
                          names: Callable[[], Mapping[str, Any]] = _no_names) -> None:
    """Makes ``inspect.signature`` of ``cls.__init__`` (where ``cls`` defines one) show
    real annotations: each annotation's text evaluated in the module of ``__init__``
    when the signature is first read.

    Args:
      cls: the class; called from ``__init_subclass__`` of a base, it covers every
        subclass.
      names: called once, at that first read: names the annotations may use beyond the
        module's own (a stand-in where an optional package is missing).
    """
    init = cls.__dict__.get("__init__")
    if not inspect.isfunction(init) or "__signature__" in init.__dict__:
        return
    try:
        written = inspect.signature(init)
    except (ValueError, TypeError):  # a user's __init__ that inspect cannot read: left so
        return
    init.__signature__ = _DeferredSignature(
        written=written, resolve=functools.partial(_resolved, init, written, names))


def as_written(function: Callable[..., Any]) -> inspect.Signature:
    """``inspect.signature(function)`` with the annotations as their text, evaluating
    nothing: for code that needs only the parameters' names, kinds and defaults."""
    signature = inspect.signature(function)
    if isinstance(signature, _DeferredSignature):
        try:
            return object.__getattribute__(signature, "_written")
        except AttributeError:  # a plain one (Signature.replace)
            pass
    return signature
