"""A torch module behind the :class:`ModelAdapter` seam, through the torch bridge.

This module is loaded only when ``cstorch.compile`` is given a torch module: it imports
torch and ``torch_bridge`` (which turns the module into a pure JAX function), and wires
the original module to the compiled state (:mod:`._torch_hooks`).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import jax
import torch
import torch.utils._pytree as pytree

from torch_bridge import Converted, Program, to_jax

from .._filters import is_array
from ..errors import ConfigError
from ..wse import Layers, Stage
from ._adapter import ModelAdapter

__all__ = ["TorchModelAdapter", "torch_model_adapter"]

# Words in a forward's source that suggest a random op (checked before any export, when
# cerebrax asks whether the model needs a PRNG key).
_RANDOM_CALLS = re.compile(
    r"\b(dropout\w*|rand|randn|randint|rand_like|randn_like|randint_like|randperm|"
    r"bernoulli_?|multinomial|normal_?|uniform_|exponential_|geometric_|poisson)\b"
)


def _may_be_random(module: torch.nn.Module) -> bool:
    """Whether ``module`` may run random ops; errs on the side of True."""
    nn = torch.nn
    for m in module.modules():
        cls = type(m)
        if cls.__module__.startswith("torch.nn."):
            if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
                return True
            if isinstance(m, nn.RNNBase) and m.dropout > 0 and m.num_layers > 1:
                return True
            if isinstance(m, nn.MultiheadAttention) and m.dropout > 0:
                return True
            continue
        try:
            source = inspect.getsource(cls.forward)
        except (OSError, TypeError):
            return True
        if _RANDOM_CALLS.search(source):
            return True
    return False


class TorchModelAdapter(ModelAdapter):
    """Runs a torch module in ``cerebrax.compile`` through :class:`Converted`.

    Parameters and buffers keep torch ``state_dict`` names (a tied parameter once, under
    its first name; ``state_dict()`` lists it under every name, as torch does); the
    module is exported once per mode (``train`` flag) and input signature, at the first
    call. The original module stays the user's handle on the model:

    - its ``training`` flag is the compiled model's mode (``module.train()`` /
      ``module.eval()`` switch it);
    - its ``parameters()`` resolve to the compiled parameters in optimizers (by
      identity); those with ``requires_grad=False`` are not trained;
    - its ``state_dict()`` and ``load_state_dict()`` read and write the compiled state
      (torch state-dict hooks, see :mod:`cerebrax.models._torch_hooks`).
    """

    is_torch = True

    def __init__(self, module: torch.nn.Module, *, needs_key: bool | None = None):
        self.module = module
        self.converted = Converted(module, train=module.training)
        self.initially_training = module.training
        self.needs_key = _may_be_random(module) if needs_key is None else bool(needs_key)
        self._state_names = list(module.state_dict(keep_vars=True))
        self._frozen = {name for name, p in module.named_parameters()
                        if not p.requires_grad}

    def params(self) -> dict[str, Any]:
        return self.converted.params

    def buffers(self) -> dict[str, Any]:
        return self.converted.buffers

    def apply(self, params: dict, buffers: dict, args: tuple, kwargs: dict, *, train: bool,
              key: jax.Array | None) -> tuple[Any, dict]:
        self._program(args, kwargs, train, key)
        return self.converted.run(params, buffers, args, kwargs, train=train, key=key)

    def _program(self, args: tuple, kwargs: dict, train: bool, key: Any) -> Program:
        program = self.converted.program(args, kwargs, train=train)
        if program.needs_key and key is None:
            raise ConfigError(
                f"The exported {type(self.module).__name__} has random ops "
                f"({', '.join(str(n.target) for n in program.random_nodes[:3])}) but its "
                "source did not show them, so no PRNG key was set up. Build the adapter "
                "with cerebrax.models.torch_model_adapter(module, needs_key=True)."
            )
        return program

    def pipeline_layers(self, params: dict, buffers: dict, args: tuple, kwargs: dict, *,
                        train: bool) -> Layers:
        """The exported graph's layers (child modules such as ``blocks.0``), in order.

        A stage's carry is every value its layers (or earlier ones) computed that a
        later stage or the module's outputs still read, e.g. a residual stream and an
        attention mask; parameters are read where they are used, so a tied weight
        used by two stages is in both and its gradient is the sum of the two uses.
        Each layer's cost is the number of parameter elements it reads plus its node
        count.
        """
        program = self.converted.program(args, kwargs, train=train)
        units = program.layers()
        nodes = [n for _, n in units]

        def stage(lo: int, hi: int) -> Stage:
            part = program.stage(nodes, lo, hi)

            def fn(p, b, carry, a, kw, key):
                leaves, _ = pytree.tree_flatten((tuple(a), dict(kw)))
                inputs = [to_jax(x) if is_array(x, torch=True) else x for x in leaves]
                out, mutated = part.run(p, b, carry, inputs, key)
                mutated = {n: v.astype(b[n].dtype) for n, v in mutated.items()}
                if part.last:
                    out = pytree.tree_unflatten(out, program.out_spec)
                return out, mutated

            return Stage(fn, part.params, part.buffers)

        return Layers([name for name, _ in units], [program.layer_cost(n) for n in nodes],
                      stage)

    def parameter_aliases(self) -> dict[Any, str]:
        return {p: self.converted.aliases[name]
                for name, p in self.module.named_parameters(remove_duplicate=False)}

    def state_dict_order(self, params: list[str], buffers: list[str]) -> list[str]:
        stored = set(params) | set(buffers) | set(self.state_dict_aliases())
        return [name for name in self._state_names if name in stored]

    def state_dict_aliases(self) -> dict[str, str]:
        names = set(self._state_names)
        return {alias: stored for alias, stored in self.converted.aliases.items()
                if alias != stored and alias in names}

    def frozen_parameters(self) -> set[str]:
        return set(self._frozen)

    def is_training(self) -> bool:
        return self.module.training

    def set_training(self, mode: bool) -> None:
        self.module.train(mode)

    def attach(self, compiled: Any) -> None:
        from ._torch_hooks import install

        install(self.module, compiled)


def torch_model_adapter(module: torch.nn.Module, *, needs_key: bool | None = None
                        ) -> TorchModelAdapter:
    """The :class:`ModelAdapter` of a torch module (what ``cstorch.compile`` uses).

    Args:
      module: the torch module; it is not modified.
      needs_key: whether the model needs a PRNG key per call; None guesses from the
        module's dropout layers and the source of its ``forward`` methods.
    """
    return TorchModelAdapter(module, needs_key=needs_key)
