"""``Adam``, ``Adamax``, ``NAdam``, ``RAdam``: torch.optim classes over pure optax factories.

Each class validates torch's arguments with torch's messages and builds the factory
from transforms/_adam_family.py per param group; the update math lives there. Their
state dicts use torch's per-parameter keys; cerebrax keeps one step count (and, for
NAdam, one ``mu_product``) per param group, written to every parameter's entry.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError, StateError
from ._optax_optimizer import OptaxOptimizer, stack_like
from .transforms import _adam_family as family
from .transforms._adam import TorchAdamState

__all__ = ["Adam", "Adamax", "NAdam", "RAdam"]

_MSG_MISSING = (
    "loaded {opt} state has a step count but no {key!r}; it was saved with other "
    "settings (e.g. amsgrad). Build the optimizer with the settings of the saved one."
)


def _check_adam_arguments(
    lr: float, betas: tuple[float, float], eps: float, weight_decay: float
) -> None:
    """torch's checks, in torch's order and words."""
    if not 0.0 <= lr:
        raise ConfigError(f"Invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ConfigError(f"Invalid epsilon value: {eps}")
    for i, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ConfigError(f"Invalid beta parameter at index {i}: {beta}")
    if not 0.0 <= weight_decay:
        raise ConfigError(f"Invalid weight_decay value: {weight_decay}")


def _refuse_differentiable(name: str, differentiable: bool) -> None:
    if differentiable:
        raise ConfigError(
            f"{name}(differentiable=True) is not supported by cerebrax: the step is compiled "
            "and is not differentiated through; drop the argument"
        )


class _TorchLayout(OptaxOptimizer):
    """Maps the group's ``scale_by_torch_*`` state to torch's per-parameter entries.

    ``_state_type`` is the NamedTuple of that state: its ``count`` is torch's ``step``,
    ``_scalar_fields`` are per-group float32 scalars that torch keeps per parameter,
    every other field is a list with one array per parameter (``()`` when unused).
    """

    _state_type: type[NamedTuple]
    _scalar_fields: tuple[str, ...] = ()

    def _find(self, group_state: Any) -> Any:
        return next(p for p in group_state if isinstance(p, self._state_type))

    def _tensor_fields(self) -> list[str]:
        return [
            f for f in self._state_type._fields if f != "count" and f not in self._scalar_fields
        ]

    def state_names_to_sparsify(self) -> list[str]:
        return self._tensor_fields()

    def _torch_state(self, group_state: Any, n: int) -> list[dict[str, Any]]:
        state = self._find(group_state)
        if int(state.count) == 0:  # torch has no state before the first step
            return [{} for _ in range(n)]
        out = []
        for j in range(n):
            entry: dict[str, Any] = {"step": np.float32(state.count)}
            for name in self._state_type._fields[1:]:
                value = getattr(state, name)
                if name in self._scalar_fields:
                    entry[name] = np.float32(value)
                elif len(value):
                    entry[name] = value[j]
            out.append(entry)
        return out

    def _one_scalar(self, per_param: list[dict[str, Any]], key: str) -> float | None:
        """The value of a per-parameter scalar, which must be the same for all."""
        values = {float(np.asarray(s[key])) for s in per_param if key in s}
        if not values:
            return None
        if len(values) != 1 or any(key not in s for s in per_param):
            raise ConfigError(
                f"loaded {type(self).__name__} state has different {key!r} values per "
                f"parameter ({sorted(values)}); cerebrax keeps one per param group, so load "
                "a state where every parameter of a group took the same steps"
            )
        return values.pop()

    def _from_torch_state(self, per_param: list[dict[str, Any]], template: Any) -> Any:
        state = self._find(template)
        step = self._one_scalar(per_param, "step")
        new = self._initial(state) if step is None else self._loaded(state, per_param, step)
        return tuple(new if isinstance(p, self._state_type) else p for p in template)

    def _initial(self, state: Any) -> Any:
        """The state before the first step (what torch's empty entries mean)."""
        fields = {f: jnp.ones((), jnp.float32) for f in self._scalar_fields}
        for f in self._tensor_fields():
            if len(getattr(state, f)):
                fields[f] = [jnp.zeros_like(a) for a in getattr(state, f)]
        return state._replace(count=jnp.zeros((), jnp.int32), **fields)

    def _loaded(self, state: Any, per_param: list[dict[str, Any]], step: float) -> Any:
        fields = {}
        for f in self._scalar_fields:
            value = self._one_scalar(per_param, f)
            if value is None:
                raise StateError(_MSG_MISSING.format(opt=type(self).__name__, key=f))
            fields[f] = jnp.asarray(value, jnp.float32)
        for f in self._tensor_fields():
            if not len(getattr(state, f)):
                continue  # unused by these settings (e.g. max_exp_avg_sq without amsgrad)
            if any(f not in s for s in per_param):
                raise StateError(_MSG_MISSING.format(opt=type(self).__name__, key=f))
            fields[f] = stack_like(getattr(state, f), [s[f] for s in per_param], f)
        return state._replace(count=jnp.asarray(int(step), jnp.int32), **fields)


class Adam(_TorchLayout):
    """Adam with torch.optim.Adam's signature and numerics.

    See :func:`cerebrax.optim.transforms.adam` for the update rule. ``weight_decay``
    is an L2 penalty on the gradient, or decoupled (AdamW) with
    ``decoupled_weight_decay=True``. ``foreach``, ``fused`` and ``capturable`` are
    accepted and ignored; ``differentiable=True`` is rejected.

    Example:
      >>> optimizer = cstorch.optim.Adam(compiled.parameters(), lr=1e-3)
    """

    _static_hyperparameters = ("betas",)
    _state_type = TorchAdamState

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        decoupled_weight_decay: bool = False,
    ):
        _refuse_differentiable("Adam", differentiable)
        _check_adam_arguments(lr, betas, eps, weight_decay)
        del foreach, capturable, fused
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            maximize=maximize,
            decoupled_weight_decay=decoupled_weight_decay,
        )
        super().__init__(params, defaults)

    def _transform(self, group: Any):
        b1, b2 = group["betas"]
        return family.adam(
            group["lr"],
            b1,
            b2,
            group["eps"],
            group["weight_decay"],
            amsgrad=group["amsgrad"],
            maximize=group["maximize"],
            decoupled_weight_decay=group["decoupled_weight_decay"],
        )


class Adamax(_TorchLayout):
    """Adamax with torch.optim.Adamax's signature and numerics.

    See :func:`cerebrax.optim.transforms.adamax` for the update rule. ``foreach`` and
    ``capturable`` are accepted and ignored; ``differentiable=True`` is rejected.

    Example:
      >>> optimizer = cstorch.optim.Adamax(compiled.parameters(), lr=2e-3)
    """

    _static_hyperparameters = ("betas",)
    _state_type = family.TorchAdamaxState

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 2e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        foreach: bool | None = None,
        *,
        maximize: bool = False,
        differentiable: bool = False,
        capturable: bool = False,
    ):
        _refuse_differentiable("Adamax", differentiable)
        _check_adam_arguments(lr, betas, eps, weight_decay)
        del foreach, capturable
        defaults = dict(
            lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, maximize=maximize
        )
        super().__init__(params, defaults)

    def _transform(self, group: Any):
        b1, b2 = group["betas"]
        return family.adamax(
            group["lr"], b1, b2, group["eps"], group["weight_decay"], maximize=group["maximize"]
        )


class NAdam(_TorchLayout):
    """NAdam with torch.optim.NAdam's signature and numerics.

    See :func:`cerebrax.optim.transforms.nadam` for the update rule. ``betas`` and
    ``momentum_decay`` are part of the compiled step; ``foreach`` and ``capturable``
    are accepted and ignored; ``differentiable=True`` is rejected.

    Example:
      >>> optimizer = cstorch.optim.NAdam(compiled.parameters(), lr=2e-3)
    """

    _static_hyperparameters = ("betas", "momentum_decay")
    _state_type = family.TorchNAdamState
    _scalar_fields = ("mu_product",)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 2e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum_decay: float = 4e-3,
        decoupled_weight_decay: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
    ):
        _refuse_differentiable("NAdam", differentiable)
        _check_adam_arguments(lr, betas, eps, weight_decay)
        if not 0.0 <= momentum_decay:
            raise ConfigError(f"Invalid momentum_decay value: {momentum_decay}")
        del foreach, capturable
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            momentum_decay=momentum_decay,
            decoupled_weight_decay=decoupled_weight_decay,
            maximize=maximize,
        )
        super().__init__(params, defaults)

    def _transform(self, group: Any):
        b1, b2 = group["betas"]
        return family.nadam(
            group["lr"],
            b1,
            b2,
            group["eps"],
            group["weight_decay"],
            group["momentum_decay"],
            maximize=group["maximize"],
            decoupled_weight_decay=group["decoupled_weight_decay"],
        )


class RAdam(_TorchLayout):
    """RAdam with torch.optim.RAdam's signature and numerics.

    See :func:`cerebrax.optim.transforms.radam` for the update rule. ``foreach`` and
    ``capturable`` are accepted and ignored; ``differentiable=True`` is rejected.

    Example:
      >>> optimizer = cstorch.optim.RAdam(compiled.parameters(), lr=1e-3)
    """

    _static_hyperparameters = ("betas",)
    _state_type = family.TorchRAdamState

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        decoupled_weight_decay: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
    ):
        _refuse_differentiable("RAdam", differentiable)
        _check_adam_arguments(lr, betas, eps, weight_decay)
        del foreach, capturable
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            decoupled_weight_decay=decoupled_weight_decay,
            maximize=maximize,
        )
        super().__init__(params, defaults)

    def _transform(self, group: Any):
        b1, b2 = group["betas"]
        return family.radam(
            group["lr"],
            b1,
            b2,
            group["eps"],
            group["weight_decay"],
            maximize=group["maximize"],
            decoupled_weight_decay=group["decoupled_weight_decay"],
        )
