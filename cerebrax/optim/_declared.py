"""Optimizers declared as torch's signature, torch's checks and an optax factory.

A torch-equivalent optimizer class holds no code of its own: its ``__init__`` is torch's
signature with cstorch's defaults, marked :func:`declared`; :attr:`TorchOptimizer._checks`
are torch's argument checks, in torch's order and words; :attr:`TorchOptimizer._factory`
is the optax factory that builds a param group's update from the group's options; and a
state layout of :mod:`._torch_layout` maps that update's state to torch's
``state_dict()``. Every argument but the implementation flags (:data:`IMPLEMENTATION_FLAGS`)
and ``differentiable`` becomes a param group default, and so a keyword argument of the
factory (``lr`` as ``learning_rate``, ``betas`` as ``b1`` and ``b2``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import optax

from ..errors import ConfigError
from ._optax_optimizer import OptaxOptimizer

__all__ = ["IMPLEMENTATION_FLAGS", "TorchOptimizer", "at_least_zero", "check",
           "check_betas", "declared", "refuse_differentiable"]

# torch arguments that choose an implementation, not the numbers: the whole step is one
# fused program, so they are accepted and dropped.
IMPLEMENTATION_FLAGS = ("foreach", "fused", "capturable")

Check = Callable[[Mapping[str, Any]], None]


def check(ok: bool, message: str) -> None:
    """Raises ConfigError with ``message`` unless ``ok`` (torch's argument checks)."""
    if not ok:
        raise ConfigError(message)


def refuse_differentiable(name: str, differentiable: bool) -> None:
    """Rejects ``differentiable=True``, which torch accepts and cerebrax cannot honour."""
    check(not differentiable,
          f"{name}(differentiable=True) is not supported by cerebrax: the step is compiled "
          "and is not differentiated through; drop the argument")


def at_least_zero(name: str, message: str | None = None) -> Check:
    """torch's check that argument ``name`` is ``>= 0``; ``message`` has one ``{}``
    for the value (default: ``Invalid {name} value: {}``)."""
    text = message or f"Invalid {name} value: {{}}"
    return lambda options: check(0.0 <= options[name], text.format(options[name]))


def check_betas(options: Mapping[str, Any]) -> None:
    """torch's check of ``betas``: two coefficients, each in ``[0, 1)``."""
    betas = options["betas"]
    check(len(betas) == 2, f"Invalid betas: {betas!r} (expected two coefficients)")
    for i, beta in enumerate(betas):
        check(0.0 <= beta < 1.0, f"Invalid beta parameter at index {i}: {beta}")


LR = at_least_zero("lr", "Invalid learning rate: {}")
EPS = at_least_zero("eps", "Invalid epsilon value: {}")
WEIGHT_DECAY = at_least_zero("weight_decay")
MOMENTUM = at_least_zero("momentum")


def declared(init: Callable[..., None]) -> Callable[..., None]:
    """Makes a signature-only ``__init__`` (body ``...``) a :class:`TorchOptimizer`'s
    constructor: the call binds to that signature, as torch's class would take it, and
    :meth:`TorchOptimizer._declare` builds the optimizer from the bound arguments.
    ``inspect.signature`` of the class shows the declared signature."""
    signature = inspect.signature(init)  # annotations stay text: nothing is evaluated
    flags = frozenset(name for name, parameter in signature.parameters.items()
                      if isinstance(parameter.default, bool))

    @functools.wraps(init)
    def __init__(self: TorchOptimizer, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        options = dict(bound.arguments)
        del options["self"]
        params = options.pop("params")
        self._declare(params, {k: bool(v) if k in flags else v for k, v in options.items()})

    return __init__


class TorchOptimizer(OptaxOptimizer):
    """A torch.optim optimizer as a declaration (see the module docstring).

    Subclasses set :attr:`_factory` and :attr:`_checks`, declare ``__init__`` with
    :func:`declared`, and mix in a state layout of :mod:`._torch_layout`.
    """

    _factory: ClassVar[Callable[..., optax.GradientTransformation]]
    _checks: ClassVar[tuple[Check, ...]] = ()

    def _declare(self, params: Any, options: dict[str, Any]) -> None:
        """Checks the bound arguments and sets the param group defaults from them."""
        refuse_differentiable(type(self).__name__, options.pop("differentiable", False))
        for flag in IMPLEMENTATION_FLAGS:
            options.pop(flag, None)
        options = self._prepare({k: tuple(v) if isinstance(v, list) else v
                                 for k, v in options.items()})
        for rule in self._checks:
            rule(options)
        OptaxOptimizer.__init__(self, params, options)

    def _prepare(self, options: dict[str, Any]) -> dict[str, Any]:
        """The group defaults from the arguments, before the checks (cstorch's aliases,
        arguments torch does not have); the arguments themselves by default."""
        return options

    def _factory_arguments(self, group: Any) -> dict[str, Any]:
        """The factory's keyword arguments for a param group: the group's options,
        ``lr`` named ``learning_rate`` and ``betas`` split into ``b1`` and ``b2``."""
        arguments = {name: group[name] for name in self.defaults}
        arguments["learning_rate"] = arguments.pop("lr")
        if "betas" in arguments:
            arguments["b1"], arguments["b2"] = arguments.pop("betas")
        return arguments

    def _transform(self, group: Any) -> optax.GradientTransformation:
        return type(self)._factory(**self._factory_arguments(group))


class BuiltMomentum(TorchOptimizer):
    """An optimizer whose groups have a momentum buffer or not, fixed when it is built
    (SGD, RMSprop): the factory gets ``use_momentum``, so a momentum changed later (a
    scheduler, a loaded state dict) never adds or drops the buffer."""

    @staticmethod
    def _has_buffer(momentum: float) -> bool:
        return momentum != 0.0

    def _factory_arguments(self, group: Any) -> dict[str, Any]:
        flags = self.__dict__.get("_momentum_flags")
        if flags is None:
            flags = self._momentum_flags = [
                self._has_buffer(float(g._opt._hparams.stored[g._index]["momentum"]))
                for g in self.param_groups
            ]
        return {**super()._factory_arguments(group), "use_momentum": flags[group._index]}
