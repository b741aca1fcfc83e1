"""``Adagrad``, ``Adadelta``, ``ASGD``, ``RMSprop``, ``Rprop``: torch.optim as thin classes.

Each class validates like torch, builds its group's transformation from
:mod:`cerebrax.optim.transforms`, and maps the transformation's state to and from
torch's per-parameter state dicts. The state NamedTuples use torch's key names, with
``count`` standing for torch's ``step``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
import optax

from ..errors import ConfigError
from ._optax_optimizer import OptaxOptimizer, stack_like
from .transforms import _adaptive as tx

__all__ = ["ASGD", "Adadelta", "Adagrad", "RMSprop", "Rprop"]


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _absent(value: Any) -> bool:
    """Whether a state field is an absent buffer (``()``)."""
    return isinstance(value, tuple) and not value


def _reject_differentiable(name: str, differentiable: bool) -> None:
    if differentiable:
        raise ConfigError(f"{name}(differentiable=True) is not supported by cerebrax")


class _TorchLayout(OptaxOptimizer):
    """Maps one state NamedTuple of the chain to torch's per-parameter state dicts.

    Fields holding one array per parameter become per-parameter tensors; scalar
    fields (ASGD's ``eta`` and ``mu``) are repeated for every parameter; ``()`` fields
    are absent buffers.
    """

    _state_type: type[NamedTuple]
    _state_before_first_step = False  # torch creates the state in __init__ (Adagrad)

    def _fill(self, field: str) -> float:
        """The value a field starts at (a state dict with no entries resets to it)."""
        return 0.0

    def _own(self, group_state: Any) -> Any:
        return next(p for p in group_state if isinstance(p, self._state_type))

    def _torch_state(self, group_state: Any, n: int) -> list[dict[str, Any]]:
        own = self._own(group_state)
        if int(own.count) == 0 and not self._state_before_first_step:
            return [{} for _ in range(n)]
        out = []
        for j in range(n):
            entry = {"step": np.float32(own.count)}
            for field in own._fields[1:]:
                value = getattr(own, field)
                if isinstance(value, (list, tuple)):
                    if not _absent(value):
                        entry[field] = value[j]
                else:
                    entry[field] = np.float32(value)
            out.append(entry)
        return out

    def _from_torch_state(self, per_param: list[dict[str, Any]], template: Any) -> Any:
        own = self._own(template)
        name = type(self).__name__
        fields = [f for f in own._fields[1:] if not _absent(getattr(own, f))]
        if not any(per_param):
            new = own._replace(count=jnp.zeros((), jnp.int32), **{
                f: self._reset(f, getattr(own, f)) for f in fields})
        else:
            expected = sorted(["step", *fields])
            for entry in per_param:
                if sorted(entry) != expected:
                    raise ConfigError(
                        f"loaded {name} state has keys {sorted(entry)}, this optimizer keeps "
                        f"{expected} for every parameter; build it with the same settings "
                        "(momentum, centered) as the optimizer that saved the state"
                    )
            values = {f: self._loaded(per_param, f, getattr(own, f)) for f in fields}
            step = self._loaded_scalar(per_param, "step")
            new = own._replace(count=jnp.asarray(int(step), jnp.int32), **values)
        return tuple(new if isinstance(p, self._state_type) else p for p in template)

    def _reset(self, field: str, like: Any) -> Any:
        if isinstance(like, list):
            return [jnp.full_like(x, self._fill(field)) for x in like]
        return jnp.full_like(like, self._fill(field))

    def _loaded(self, per_param: list[dict[str, Any]], field: str, like: Any) -> Any:
        if isinstance(like, list):
            return stack_like(like, [s[field] for s in per_param], field)
        return jnp.asarray(self._loaded_scalar(per_param, field), like.dtype)

    def _loaded_scalar(self, per_param: list[dict[str, Any]], field: str) -> float:
        values = {float(np.asarray(s[field])) for s in per_param}
        if len(values) != 1:
            raise ConfigError(
                f"loaded {type(self).__name__} state has different {field!r} values per "
                f"parameter ({sorted(values)}); cerebrax keeps one per param group"
            )
        return values.pop()


class Adagrad(_TorchLayout):
    """Adagrad with torch.optim.Adagrad's signature and numerics.

    See :func:`cerebrax.optim.transforms.adagrad` for the update rule. As in torch,
    every group's accumulator starts at the constructor's
    ``initial_accumulator_value`` and the state exists before the first step.
    ``foreach`` and ``fused`` are accepted and ignored; ``differentiable=True`` is
    rejected.

    Example:
      >>> optimizer = cstorch.optim.Adagrad(compiled.parameters(), lr=1e-2)
    """

    _static_hyperparameters = ("initial_accumulator_value",)
    _state_type = tx.AdagradState
    _state_before_first_step = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        lr_decay: float = 0,
        weight_decay: float = 0,
        initial_accumulator_value: float = 0,
        eps: float = 1e-10,
        foreach: bool | None = None,
        *,
        maximize: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ):
        _reject_differentiable("Adagrad", differentiable)
        _check(0.0 <= lr, f"Invalid learning rate: {lr}")
        _check(0.0 <= lr_decay, f"Invalid lr_decay value: {lr_decay}")
        _check(0.0 <= weight_decay, f"Invalid weight_decay value: {weight_decay}")
        _check(0.0 <= initial_accumulator_value,
               f"Invalid initial_accumulator_value value: {initial_accumulator_value}")
        _check(0.0 <= eps, f"Invalid epsilon value: {eps}")
        del foreach, fused
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value,
                        maximize=maximize)
        super().__init__(params, defaults)

    def _fill(self, field: str) -> float:
        return float(self.defaults["initial_accumulator_value"])

    def _transform(self, group: Any) -> optax.GradientTransformation:
        return tx.adagrad(
            group["lr"], group["lr_decay"], group["weight_decay"],
            self.defaults["initial_accumulator_value"], group["eps"],
            maximize=group["maximize"],
        )

    def state_names_to_sparsify(self) -> list[str]:
        return ["sum"]


class Adadelta(_TorchLayout):
    """Adadelta with torch.optim.Adadelta's signature and numerics.

    See :func:`cerebrax.optim.transforms.adadelta` for the update rule. ``foreach``
    and ``capturable`` are accepted and ignored; ``differentiable=True`` is rejected.

    Example:
      >>> optimizer = cstorch.optim.Adadelta(compiled.parameters(), lr=1.0, rho=0.9)
    """

    _static_hyperparameters = ("rho",)
    _state_type = tx.AdadeltaState

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1.0,
        rho: float = 0.9,
        eps: float = 1e-6,
        weight_decay: float = 0,
        foreach: bool | None = None,
        *,
        capturable: bool = False,
        maximize: bool = False,
        differentiable: bool = False,
    ):
        _reject_differentiable("Adadelta", differentiable)
        _check(0.0 <= lr, f"Invalid learning rate: {lr}")
        _check(0.0 <= rho <= 1.0, f"Invalid rho value: {rho}")
        _check(0.0 <= eps, f"Invalid epsilon value: {eps}")
        _check(0.0 <= weight_decay, f"Invalid weight_decay value: {weight_decay}")
        del foreach, capturable
        defaults = dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize)
        super().__init__(params, defaults)

    def _transform(self, group: Any) -> optax.GradientTransformation:
        return tx.adadelta(group["lr"], group["rho"], group["eps"],
                                   group["weight_decay"], maximize=group["maximize"])

    def state_names_to_sparsify(self) -> list[str]:
        return ["square_avg", "acc_delta"]


class ASGD(_TorchLayout):
    """Averaged SGD with torch.optim.ASGD's signature and numerics.

    See :func:`cerebrax.optim.transforms.asgd` for the update rule; the averaged
    parameters are ``state[p]["ax"]`` in :meth:`state_dict`. ``foreach`` and
    ``capturable`` are accepted and ignored; ``differentiable=True`` is rejected.

    Example:
      >>> optimizer = cstorch.optim.ASGD(compiled.parameters(), lr=1e-2, t0=100)
    """

    _static_hyperparameters = ("lambd", "alpha", "t0")
    _state_type = tx.ASGDState

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        lambd: float = 1e-4,
        alpha: float = 0.75,
        t0: float = 1e6,
        weight_decay: float = 0,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
        capturable: bool = False,
    ):
        _reject_differentiable("ASGD", differentiable)
        _check(0.0 <= lr, f"Invalid learning rate: {lr}")
        _check(0.0 <= weight_decay, f"Invalid weight_decay value: {weight_decay}")
        del foreach, capturable
        defaults = dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay,
                        maximize=maximize)
        super().__init__(params, defaults)

    def _fill(self, field: str) -> float:
        return 1.0 if field == "mu" else 0.0

    def _transform(self, group: Any) -> optax.GradientTransformation:
        return tx.asgd(group["lr"], group["lambd"], group["alpha"], group["t0"],
                               group["weight_decay"], maximize=group["maximize"])

    def state_names_to_sparsify(self) -> list[str]:
        return ["ax"]


class RMSprop(_TorchLayout):
    """RMSprop with torch.optim.RMSprop's signature and numerics.

    See :func:`cerebrax.optim.transforms.rmsprop` for the update rule. Whether a group
    keeps a momentum buffer is fixed by its momentum when the optimizer is built.
    ``foreach`` and ``capturable`` are accepted and ignored; ``differentiable=True``
    is rejected.

    Example:
      >>> optimizer = cstorch.optim.RMSprop(compiled.parameters(), lr=1e-2, momentum=0.9)
    """

    _static_hyperparameters = ("alpha",)
    _state_type = tx.RMSpropState

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0,
        momentum: float = 0,
        centered: bool = False,
        capturable: bool = False,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
    ):
        _reject_differentiable("RMSprop", differentiable)
        _check(0.0 <= lr, f"Invalid learning rate: {lr}")
        _check(0.0 <= eps, f"Invalid epsilon value: {eps}")
        _check(0.0 <= momentum, f"Invalid momentum value: {momentum}")
        _check(0.0 <= weight_decay, f"Invalid weight_decay value: {weight_decay}")
        _check(0.0 <= alpha, f"Invalid alpha value: {alpha}")
        del foreach, capturable
        defaults = dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps, centered=centered,
                        weight_decay=weight_decay, maximize=maximize)
        super().__init__(params, defaults)

    def _uses_momentum(self, group: Any) -> bool:
        # Whether a group has a momentum buffer is fixed when the optimizer is built.
        flags = getattr(self, "_momentum_flags", None)
        if flags is None:
            flags = self._momentum_flags = [
                float(g._opt._hparams._value[g._index]["momentum"]) > 0.0
                for g in self.param_groups
            ]
        return flags[group._index]

    def _transform(self, group: Any) -> optax.GradientTransformation:
        return tx.rmsprop(
            group["lr"], group["alpha"], group["eps"], group["weight_decay"],
            group["momentum"], centered=group["centered"], maximize=group["maximize"],
            use_momentum=self._uses_momentum(group),
        )

    def state_names_to_sparsify(self) -> list[str]:
        return ["square_avg", "momentum_buffer", "grad_avg"]


class Rprop(_TorchLayout):
    """Rprop with torch.optim.Rprop's signature and numerics.

    See :func:`cerebrax.optim.transforms.rprop` for the update rule; ``lr`` is only
    the initial step size, read at the first step. ``foreach`` and ``capturable`` are
    accepted and ignored; ``differentiable=True`` is rejected.

    Example:
      >>> optimizer = cstorch.optim.Rprop(compiled.parameters(), lr=1e-2, etas=(0.5, 1.2))
    """

    _state_type = tx.RpropState

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        etas: tuple[float, float] = (0.5, 1.2),
        step_sizes: tuple[float, float] = (1e-6, 50),
        *,
        capturable: bool = False,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
    ):
        _reject_differentiable("Rprop", differentiable)
        _check(0.0 <= lr, f"Invalid learning rate: {lr}")
        _check(0.0 < etas[0] < 1.0 < etas[1], f"Invalid eta values: {etas[0]}, {etas[1]}")
        del foreach, capturable
        defaults = dict(lr=lr, etas=tuple(etas), step_sizes=tuple(step_sizes),
                        maximize=maximize)
        super().__init__(params, defaults)

    def _transform(self, group: Any) -> optax.GradientTransformation:
        return tx.rprop(group["lr"], group["etas"], group["step_sizes"],
                                maximize=group["maximize"])

    def state_names_to_sparsify(self) -> list[str]:
        return ["prev", "step_size"]
