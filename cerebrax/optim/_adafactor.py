"""``Adafactor``: torch.optim.Adafactor as a thin class over :func:`transforms.adafactor`."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError
from ._base import ParamsT
from ._declared import TorchOptimizer, at_least_zero, check, declared
from ._optax_optimizer import stack_like
from .transforms._adafactor import RelativeStepState, TorchAdafactorState, adafactor

__all__ = ["Adafactor"]

MSG_RELATIVE_STEP = """\
Adafactor(relative_step={value!r}) has no exact equivalent: cerebrax follows
torch.optim.Adafactor, whose step size is always min(lr, 1 / sqrt(t)) * max(eps[1], RMS(p)).
relative_step=False (a step size of lr alone) agrees with it only while t <= 1 / lr**2.
Drop relative_step and choose lr; for example
    Adafactor(params, lr=1e-3, relative_step=False)   # wrong
    Adafactor(params, lr=1e-3)                        # right"""


def _alias(torch_name: str, torch_value: float, torch_default: float,
           old_name: str, old_value: float | None) -> float:
    """The value of a torch argument that cstorch spelled ``old_name``."""
    if old_value is None:
        return torch_value
    if torch_value != torch_default and torch_value != old_value:
        raise ConfigError(
            f"Adafactor got {torch_name}={torch_value!r} and {old_name}={old_value!r}; "
            f"{old_name} is cstorch's name for {torch_name}, give only {torch_name}"
        )
    return old_value


def _reject_cstorch_only(beta1: float | None, scale_parameter: bool | None,
                         relative_step: bool | None, warmup_init: bool | None) -> None:
    if beta1 is not None:
        raise ConfigError(
            f"Adafactor(beta1={beta1!r}): torch.optim.Adafactor keeps no first moment; "
            "drop beta1 (cstorch also required beta1=None)"
        )
    if scale_parameter is not None and not scale_parameter:
        raise ConfigError(
            "Adafactor(scale_parameter=False): torch.optim.Adafactor always scales the "
            "step by max(eps[1], RMS(p)); drop scale_parameter"
        )
    if relative_step is not None:
        raise ConfigError(MSG_RELATIVE_STEP.format(value=relative_step))
    if warmup_init:
        raise ConfigError(
            "Adafactor(warmup_init=True): torch.optim.Adafactor has no warm-up of the "
            "relative step; drop warmup_init and use a learning-rate scheduler"
        )


class Adafactor(TorchOptimizer):
    """Adafactor with torch.optim.Adafactor's signature and numerics.

    As in cstorch, ``lr`` has no default (torch's is ``1e-2``). ``eps`` keeps torch's
    default ``(None, 1e-3)``, not cstorch's ``(1e-30, 1e-3)``: with torch's update rule
    ``eps[0]`` floors ``v`` at ``eps[0]**2``, which for ``1e-30`` is 0 in float32, so a
    gradient entry that has been exactly 0 would divide 0 by 0 (NaN); ``None`` floors
    at the dtype's machine epsilon squared.

    See :func:`cerebrax.optim.transforms.adafactor` for the update rule. Parameters
    with two or more dimensions keep factored ``row_var`` / ``col_var`` second moments
    over their last two dimensions, others a full ``variance``; the torch-layout state
    holds those and ``step`` per parameter. ``eps=(None, eps2)`` uses the machine epsilon
    of each parameter's dtype as ``eps1``. ``foreach`` is accepted and ignored (torch's
    two code paths compute the same update); ``differentiable=True`` is rejected.

    cstorch's older Adafactor arguments:

    * ``decay_rate`` is ``beta2_decay`` (both give ``beta2_t = 1 - t ** decay_rate``)
      and ``clip_threshold`` is ``d``; both are accepted as aliases.
    * ``beta1=None``, ``scale_parameter=True`` and ``warmup_init=False`` are what torch
      always does and are accepted; ``beta1`` set, ``scale_parameter=False`` and
      ``warmup_init=True`` raise :class:`ConfigError`.
    * ``relative_step`` raises :class:`ConfigError` whatever its value: torch's step
      size is ``min(lr, 1 / sqrt(t))``, neither cstorch's ``lr`` nor its relative step.
    * cstorch added ``eps[0]`` (default 1e-30) to ``g^2`` and decayed weights by the
      scaled step size; torch, and so cerebrax, floors the row mean and ``v`` with
      ``eps[0]`` and decays weights by ``lr * weight_decay``.

    Example:
      >>> model = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.Adafactor(model.parameters(), lr=1e-2)
      >>> @cstorch.trace
      ... def train_step(inputs):
      ...     model(inputs).square().mean().backward()
      ...     optimizer.step()
      >>> train_step(torch.ones(8, 4))
      >>> state = optimizer.state_dict()["state"]
      >>> sorted(state[0]), sorted(state[1])  # the weight's factored state, the bias's full one
      (['col_var', 'row_var', 'step'], ['step', 'variance'])
    """

    _static_hyperparameters = ("eps",)
    _factory = adafactor
    _checks = (
        at_least_zero("lr", "Learning rate should be >= 0 but is: {}"),
        lambda o: check(0.0 >= o["beta2_decay"],
                        f"beta2_decay should be <= 0 but is: {o['beta2_decay']}"),
        lambda o: check(len(o["eps"]) == 2,
                        f"Invalid eps: {o['eps']!r} (expected (eps1 or None, eps2))"),
        lambda o: check(o["eps"][0] is None or 0.0 <= o["eps"][0],
                        f"epsilon1 should be >= 0 but is: {o['eps'][0]}"),
        lambda o: check(0.0 <= o["eps"][1], f"epsilon2 should be >= 0 but is: {o['eps'][1]}"),
        lambda o: check(1.0 <= o["d"], f"Clipping threshold d should be >= 1 but is: {o['d']}"),
        at_least_zero("weight_decay", "weight_decay should be >= 0 but is: {}"),
    )

    @declared
    def __init__(self, params: ParamsT, lr: float, beta2_decay: float = -0.8,
                 eps: tuple[float | None, float] = (None, 1e-3), d: float = 1.0,
                 weight_decay: float = 0.0, *, foreach: bool | None = None,
                 maximize: bool = False, differentiable: bool = False,
                 decay_rate: float | None = None, clip_threshold: float | None = None,
                 beta1: float | None = None, scale_parameter: bool | None = None,
                 relative_step: bool | None = None, warmup_init: bool | None = None): ...

    def _prepare(self, options: dict[str, Any]) -> dict[str, Any]:
        """Refuses cstorch's arguments torch has no equivalent for and resolves its
        aliases (``decay_rate``, ``clip_threshold``)."""
        _reject_cstorch_only(*(options.pop(name) for name in (
            "beta1", "scale_parameter", "relative_step", "warmup_init")))
        options["beta2_decay"] = _alias("beta2_decay", options["beta2_decay"], -0.8,
                                        "decay_rate", options.pop("decay_rate"))
        options["d"] = _alias("d", options["d"], 1.0, "clip_threshold",
                              options.pop("clip_threshold"))
        return options

    def _factory_arguments(self, group: Any) -> dict[str, Any]:
        arguments = super()._factory_arguments(group)
        arguments["eps1"], arguments["eps2"] = arguments.pop("eps")
        return arguments

    def state_names_to_sparsify(self) -> list[str]:
        return ["variance"]

    @staticmethod
    def _part(group_state: Any, kind: type) -> Any:
        return next(p for p in group_state if isinstance(p, kind))

    def _torch_state(self, group_state: Any, n: int) -> list[dict[str, Any]]:
        state = self._part(group_state, TorchAdafactorState)
        if int(state.count) == 0:
            return [{} for _ in range(n)]
        out = []
        for j in range(n):
            entry: dict[str, Any] = {"step": np.float32(state.count)}
            if isinstance(state.variance[j], tuple):
                entry["row_var"] = state.row_var[j]
                entry["col_var"] = state.col_var[j]
            else:
                entry["variance"] = state.variance[j]
            out.append(entry)
        return out

    def _from_torch_state(self, per_param: list[dict[str, Any]], template: Any) -> Any:
        state = self._part(template, TorchAdafactorState)
        steps = {float(np.asarray(s["step"])) for s in per_param if "step" in s}
        if not steps:
            count = 0
            new = TorchAdafactorState(
                jnp.zeros((), jnp.int32),
                *([() if isinstance(x, tuple) else jnp.zeros_like(x) for x in moments]
                  for moments in (state.row_var, state.col_var, state.variance)),
            )
        else:
            if len(steps) != 1 or any("step" not in s for s in per_param):
                raise ConfigError(
                    "loaded Adafactor state has different step counts per parameter; "
                    "cerebrax keeps one step count per param group"
                )
            count = int(steps.pop())
            new = TorchAdafactorState(
                jnp.asarray(count, jnp.int32),
                *(self._load(state, per_param, name)
                  for name in ("row_var", "col_var", "variance")),
            )
        relative = RelativeStepState(jnp.asarray(count, jnp.int32))
        swap = {TorchAdafactorState: new, RelativeStepState: relative}
        return tuple(swap.get(type(p), p) for p in template)

    @staticmethod
    def _load(state: TorchAdafactorState, per_param: list[dict[str, Any]], name: str) -> list:
        out = []
        for like, saved in zip(getattr(state, name), per_param):
            if isinstance(like, tuple):
                out.append(())
            elif name not in saved:
                raise ConfigError(
                    f"loaded Adafactor state lacks {name!r} for a parameter that keeps it "
                    f"(keys: {sorted(saved)}); was it saved for a parameter of another shape?"
                )
            else:
                out.append(stack_like([like], [saved[name]], name)[0])
        return out
