"""``OptaxOptimizer``: a thin cstorch-style class over a pure optax factory.

The class holds no update math. Each param group gets the transformation built by
the factory from the group's hyperparameters (traced arrays inside the step, so a new
learning rate never recompiles); its optax state lives in a registered slot. Param
groups are fixed partitions computed once at construction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import _step
from .._step import context_with_grads
from ..errors import ConfigError
from ._base import Optimizer, stack_like

__all__ = ["OptaxOptimizer", "stack_like"]


class OptaxOptimizer(Optimizer):
    """Base of the built-in optimizers. Subclasses define the factory and the mapping.

    Subclasses implement :meth:`_transform` (group hyperparameters -> optax
    transformation) and, for torch-layout state dicts, :meth:`_torch_state` and
    :meth:`_from_torch_state`.
    """

    def _transform(self, group: Any) -> optax.GradientTransformation:
        raise NotImplementedError

    def preinitialize(self) -> None:
        # Zero moments and step counts are made on the host. Otherwise one program
        # initializes every group: run eagerly, each operation on a new shape would
        # compile a program of its own.
        inits = [self._transform(group).init for group in self.param_groups]
        values = [[p.stored for p in group["params"]] for group in self.param_groups]

        def init_all(values: list) -> list:
            return [init(v) for init, v in zip(inits, values)]

        states = _step.constant_on_host(init_all, values)
        if states is None:
            states = jax.jit(init_all)(values)
        self._tx_state = _step.StateRef(
            states, name=f"{type(self).__name__}.optax_state", skippable=True
        )

    def step(self, closure: Callable[[], Any] | None = None) -> None:
        """Applies one update to every param group from the gradients of this step."""
        if closure is not None:
            raise ConfigError(
                "optimizer.step(closure) is not supported: the loss is computed by the "
                "traced step; call step() with no arguments."
            )
        ctx = context_with_grads(f"{type(self).__name__}.step()")
        self._traced = True
        states = list(self._tx_state.value)
        for i, group in enumerate(self.param_groups):
            params = group["params"]
            grads_before = [ctx.grad(p) for p in params]
            if all(g is None for g in grads_before):
                continue
            values = [p.value for p in params]
            grads = [jnp.zeros_like(v) if g is None else g.astype(v.dtype)
                     for g, v in zip(grads_before, values)]
            updates, states[i] = self._transform(group).update(grads, states[i], values)
            new_values = optax.apply_updates(values, updates)
            for p, g, new in zip(params, grads_before, new_values):
                if g is not None:
                    p.value = new
        self._tx_state.value = states

    def visit_state(self, fn: Callable[[Any], Any]) -> None:
        """Calls ``fn`` on every array of the optimizer's state (moments, momentum
        buffers, step counts: what torch keeps in ``optimizer.state``); a result that is
        not None replaces the array, cast back to its dtype."""
        def visit(value: Any) -> Any:
            result = fn(value)
            return value if result is None else jnp.asarray(result).astype(value.dtype)

        self._tx_state.value = jax.tree.map(visit, self._tx_state.value)

    # ---- torch-layout state dicts ----------------------------------------------------
    def _torch_state(self, group_state: Any, n: int) -> list[dict[str, Any]]:
        """Per-parameter torch state dicts of one group, from its optax state."""
        raise NotImplementedError

    def _from_torch_state(self, per_param: list[dict[str, Any]], template: Any) -> Any:
        """The optax state of one group from torch per-parameter state dicts."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """The state in ``torch.optim`` layout: ``{"state": {i: {...}}, "param_groups": [...]}``."""
        # Host sync point: the values of the last step are fetched.
        states = jax.device_get(self._tx_state.value)
        out_state: dict[int, dict[str, Any]] = {}
        offset = 0
        for group, gstate in zip(self.param_groups, states):
            n = len(group["params"])
            for j, entry in enumerate(self._torch_state(gstate, n)):
                if entry:
                    out_state[offset + j] = {k: np.array(v) for k, v in entry.items()}
            offset += n
        return {"state": out_state, "param_groups": self._group_dicts()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a state dict in ``torch.optim`` layout (from cerebrax or from torch)."""
        pairs = self._loaded_groups(state_dict)
        state = {int(k): v for k, v in state_dict["state"].items()}
        new_states = [
            self._from_torch_state([state.get(i, {}) for i in indices], template)
            for (_, indices), template in zip(pairs, self._tx_state.stored)
        ]
        self._load_hyperparameters(pairs)
        self._tx_state.value = new_states

