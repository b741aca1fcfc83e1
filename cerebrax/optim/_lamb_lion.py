"""``Lamb`` and ``Lion``: cstorch's optimizers as thin classes over pure optax factories."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from ..errors import ConfigError
from ._base import ParamsT
from ._optax_optimizer import OptaxOptimizer, stack_like
from .transforms._lamb_lion import LambState, LionState, lamb, lion

__all__ = ["Lamb", "Lion"]


def _check_common(name: str, lr: float, betas: tuple[float, float], weight_decay: float,
                  differentiable: bool) -> None:
    if differentiable:
        raise ConfigError(f"{name}(differentiable=True) is not supported by cerebrax")
    if not 0.0 <= lr:
        raise ConfigError(f"Invalid learning rate: {lr}")
    if len(betas) != 2:
        raise ConfigError(f"Invalid betas: {betas!r} (expected two coefficients)")
    for i, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ConfigError(f"Invalid beta parameter at index {i}: {beta}")
    if not 0.0 <= weight_decay:
        raise ConfigError(f"Invalid weight_decay value: {weight_decay}")


class _MomentStateMapping:
    """Maps a moment-only optax state (no step-dependent math) to torch layout.

    Like cstorch, which allocates the moments when the optimizer is built, every
    parameter has its moments in ``state_dict()`` from the start (zeros before the
    first step). The step count is not part of that layout: a loaded state restarts
    it at 0, which changes nothing in the update.
    """

    _state_type: type
    _moment_names: tuple[str, ...]

    def state_names_to_sparsify(self) -> list[str]:
        return list(self._moment_names)

    def _moments(self, group_state: Any) -> Any:
        return next(p for p in group_state if isinstance(p, self._state_type))

    def _torch_state(self, group_state: Any, n: int) -> list[dict[str, Any]]:
        state = self._moments(group_state)
        return [{name: getattr(state, name)[j] for name in self._moment_names}
                for j in range(n)]

    def _from_torch_state(self, per_param: list[dict[str, Any]], template: Any) -> Any:
        state = self._moments(template)
        new = state._replace(count=jnp.zeros((), jnp.int32))
        for name in self._moment_names:
            like = getattr(state, name)
            present = [s.get(name) is not None for s in per_param]
            if any(present) and not all(present):
                raise ConfigError(
                    f"loaded {type(self).__name__} state has {name!r} for only some "
                    "parameters; give it for every parameter of the group or for none"
                )
            if all(present):
                values = stack_like(like, [s[name] for s in per_param], name)
            else:
                values = [jnp.zeros_like(x) for x in like]
            new = new._replace(**{name: values})
        return tuple(new if isinstance(p, self._state_type) else p for p in template)


class Lamb(_MomentStateMapping, OptaxOptimizer):
    """Lamb with cstorch's signature and numerics.

    See :func:`cerebrax.optim.transforms.lamb` for the update rule: Adam moments
    without bias correction, ``weight_decay * p`` added to the Adam step, and a
    layer-wise trust ratio ``clip(||p||, 0, 10) / ||r||`` (1 when ``adam=True``).
    ``maximize`` negates the gradient; ``foreach`` is accepted and ignored;
    ``differentiable=True`` is rejected. The torch-layout state holds ``exp_avg`` and
    ``exp_avg_sq`` per parameter.

    Example:
      >>> compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.Lamb(compiled.parameters(), lr=1e-3, weight_decay=0.01)
      >>> @cstorch.trace
      ... def train_step(inputs, targets):
      ...     loss = torch.nn.functional.mse_loss(compiled(inputs), targets)
      ...     optimizer.zero_grad()
      ...     loss.backward()
      ...     optimizer.step()
      ...     return loss
      >>> loss = train_step(torch.ones(8, 4), torch.zeros(8, 2))
      >>> sorted(optimizer.state_dict()["state"][0])  # the weight's state
      ['exp_avg', 'exp_avg_sq']
    """

    _static_hyperparameters = ("betas",)
    _state_type = LambState
    _moment_names = ("exp_avg", "exp_avg_sq")

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0,
        adam: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        differentiable: bool = False,
    ):
        _check_common("Lamb", lr, betas, weight_decay, differentiable)
        if not 0.0 <= eps:
            raise ConfigError(f"Invalid epsilon value: {eps}")
        del foreach
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        adam=bool(adam), maximize=maximize)
        super().__init__(params, defaults)

    def _transform(self, group: Any):
        b1, b2 = group["betas"]
        return lamb(group["lr"], b1, b2, group["eps"], group["weight_decay"],
                    adam=group["adam"], maximize=group["maximize"])


class Lion(_MomentStateMapping, OptaxOptimizer):
    """Lion with cstorch's signature and numerics.

    See :func:`cerebrax.optim.transforms.lion` for the update rule: the sign of an
    interpolation of momentum and gradient, with decoupled weight decay
    ``p *= 1 - lr * weight_decay``. ``maximize`` negates the gradient; ``foreach`` is
    accepted and ignored; ``differentiable=True`` is rejected. The torch-layout state
    holds ``exp_avg`` per parameter.

    Example:
      >>> compiled = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.Lion(compiled.parameters(), lr=1e-4, weight_decay=0.1)
      >>> @cstorch.trace
      ... def train_step(inputs, targets):
      ...     loss = torch.nn.functional.mse_loss(compiled(inputs), targets)
      ...     optimizer.zero_grad()
      ...     loss.backward()
      ...     optimizer.step()
      ...     return loss
      >>> loss = train_step(torch.ones(8, 4), torch.zeros(8, 2))
      >>> sorted(optimizer.state_dict()["state"][0])  # the weight's state
      ['exp_avg']
    """

    _static_hyperparameters = ("betas",)
    _state_type = LionState
    _moment_names = ("exp_avg",)

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        differentiable: bool = False,
    ):
        _check_common("Lion", lr, betas, weight_decay, differentiable)
        del foreach
        defaults = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay,
                        maximize=maximize)
        super().__init__(params, defaults)

    def _transform(self, group: Any):
        b1, b2 = group["betas"]
        return lion(group["lr"], b1, b2, group["weight_decay"], maximize=group["maximize"])
