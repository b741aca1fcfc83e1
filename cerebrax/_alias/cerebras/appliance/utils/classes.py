"""``cerebras.appliance.utils.classes``: cerebrax's minimal stand-in for the class utilities
of Cerebras' appliance package, present only under the cstorch alias."""

from __future__ import annotations

__all__ = ["retrieve_all_subclasses"]


def retrieve_all_subclasses(cls: type) -> list[type]:
    """Every subclass of ``cls``, direct or not, each once, ``cls`` itself excluded: depth
    first, each class before its own subclasses, in definition order.

    Model Zoo lists the optimizers, schedulers, callbacks and loggers a config may name
    with it (``retrieve_all_subclasses(cstorch.optim.Optimizer)``).

    Example:
      >>> class A: pass
      >>> class B(A): pass
      >>> class C(B): pass
      >>> class D(A): pass
      >>> [k.__name__ for k in retrieve_all_subclasses(A)]
      ['B', 'C', 'D']
    """
    found: dict[type, None] = {}

    def visit(parent: type) -> None:
        for child in type.__subclasses__(parent):  # cls.__subclasses__() fails for type
            if child not in found:
                found[child] = None
                visit(child)

    visit(cls)
    return list(found)
