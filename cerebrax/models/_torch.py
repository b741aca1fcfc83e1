"""A torch module behind the :class:`ModelAdapter` seam, through the torch bridge.

This module is loaded only when ``cstorch.compile`` is given a torch module: it imports
torch and ``torch_bridge`` (which turns the module into a pure JAX function), and wires
the original module to the compiled state (:mod:`._torch_hooks`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import torch
import torch.utils._pytree as pytree

from torch_bridge import Converted, JaxTensor, keep_for_functions, random_seed, to_jax

from .._filters import is_array
from ..backend import hand_over, materialize
from ..core.annotation import pol_regions
from ..wse import Layers, Stage
from ._adapter import ModelAdapter

__all__ = ["TorchModelAdapter", "TorchOutputs", "torch_model_adapter"]

# A custom autograd Function in a compiled model's forward reads current_pol() where
# torch runs it: inside the pol(level=...) regions around its call.
keep_for_functions(pol_regions)

@jax.tree_util.register_pytree_node_class
class TorchOutputs:
    """A torch module's outputs on their way through JAX: torch's pytree leaves and the
    torch structure they came in (a transformers ``ModelOutput``, a dict, a tuple).

    JAX sees the leaves (they cross ``jax.jit`` and micro-batch scans); :meth:`rebuild`
    gives the structure back. ``side_calls``: where the leaves end with the arguments of
    calls ``forward`` made for their effect (a metric update in a pipeline's last
    stage, which runs inside the device mesh's ``shard_map``), :meth:`rebuild` makes
    those calls, outside it, on the gathered values.
    """

    def __init__(self, leaves: list, spec: pytree.TreeSpec, side_calls: Any = None):
        self.leaves = list(leaves)
        self.spec = spec
        self.side_calls = side_calls

    def tree_flatten(self) -> tuple[tuple, tuple]:
        return tuple(self.leaves), (self.spec, self.side_calls)

    @classmethod
    def tree_unflatten(cls, aux: tuple, leaves: Any) -> TorchOutputs:
        return cls(list(leaves), *aux)

    def rebuild(self, leaf: Callable[[Any], Any]) -> Any:
        leaves = self.leaves if self.side_calls is None else self.side_calls.run(self.leaves)
        return pytree.tree_unflatten([leaf(x) for x in leaves], self.spec)


class TorchModelAdapter(ModelAdapter):
    """Runs a torch module in ``cerebrax.compile`` through :class:`Converted`.

    Parameters and buffers keep torch ``state_dict`` names (a tied parameter once, under
    its first name; ``state_dict()`` lists it under every name, as torch does). A call
    traces the module's ``forward`` op by op on the step's values where that gives the
    exported graph's program (:meth:`torch_bridge.Converted.run_direct`), and otherwise
    runs the graph exported once per mode (``train`` flag) and input signature, at the
    first such call. The original module stays the user's handle on the model:

    - its ``training`` flag is the compiled model's mode (``module.train()`` /
      ``module.eval()`` switch it);
    - its ``parameters()`` resolve to the compiled parameters in optimizers (by
      identity); those with ``requires_grad=False`` are not trained;
    - its ``state_dict()`` and ``load_state_dict()`` read and write the compiled state
      (torch state-dict hooks, see :mod:`cerebrax.models._torch_hooks`).

    Every torch model gets a PRNG key per call (``needs_key``), seeded from
    ``torch.manual_seed``: whether its graph has random ops (dropout, stochastic depth,
    ``torch.rand``) is known only once it is exported, at the first call inside the
    step, after the step's state is fixed. Each random op of the graph draws from its
    own split of the key; a graph without random ops leaves the key unused.

    Array inputs are traced; bools, ints, strings and None are constants of the graph.
    A transformers model runs with ``use_cache=False`` unless the call passes it
    (:func:`torch_bridge.call_defaults`). Outputs keep torch's structure: a
    ``ModelOutput`` answers ``out.loss`` and ``out["logits"]``.
    """

    is_torch = True
    needs_key = True

    def __init__(self, module: torch.nn.Module):
        self.module = module
        materialize(module)  # a module built on torch's meta device gets its values
        self.converted = Converted(module, train=module.training)
        self.initially_training = module.training
        self._state_names = list(module.state_dict(keep_vars=True))
        self._frozen = {name for name, p in module.named_parameters()
                        if not p.requires_grad}
        self._call_dtypes: tuple | None = None  # see calling_with

    def params(self) -> Mapping[str, Any]:
        # Tensors built under `with backend.device:` (or on meta) are freed as the
        # compiled state copies them (cerebrax.backend.hand_over).
        return hand_over(self.module, self.converted.params)

    def buffers(self) -> Mapping[str, Any]:
        return hand_over(self.module, self.converted.buffers)

    def initial_key(self) -> jax.Array:
        return random_seed()

    @contextlib.contextmanager
    def calling_with(self, args: tuple, kwargs: dict) -> Iterator[None]:
        """The block traces one call on ``(args, kwargs)``: :meth:`apply` exports the
        JAX values it is then given with the torch dtype of each input leaf that was a
        torch tensor (an int32 tensor stays int32 in ``forward``)."""
        leaves, _ = self.converted.flatten(args, kwargs)
        dtypes = tuple(x.dtype if isinstance(x, torch.Tensor) else None for x in leaves)
        saved, self._call_dtypes = self._call_dtypes, dtypes
        try:
            yield
        finally:
            self._call_dtypes = saved

    def _program(self, args: tuple, kwargs: dict, train: bool):
        return self.converted.program(args, kwargs, train=train,
                                      torch_dtypes=self._call_dtypes)

    def apply(self, params: dict, buffers: dict, args: tuple, kwargs: dict, *, train: bool,
              key: jax.Array | None) -> tuple[TorchOutputs, dict]:
        direct = self.converted.run_direct(params, buffers, args, kwargs, train=train,
                                           torch_dtypes=self._call_dtypes)
        if direct is not None:
            out, spec, new_buffers = direct
            return TorchOutputs(out, spec), new_buffers
        program = self._program(args, kwargs, train)
        out, new_buffers = self.converted.run(params, buffers, args, kwargs, train=train,
                                              key=key, flat=True, program=program)
        return TorchOutputs(out, program.out_spec), new_buffers

    def outputs(self, out: TorchOutputs, *, torch_tensors: bool) -> Any:
        """The module's outputs: torch tensors where its inputs were (see
        :meth:`ModelAdapter.outputs`). As in torch, a floating output of a module with
        trainable parameters, called with gradients enabled, ``requires_grad`` (and is no
        leaf), so torch code that asks (``torch.autograd.functional``) differentiates it."""
        if not torch_tensors:
            return out.rebuild(lambda x: x)
        differentiable = torch.is_grad_enabled() and any(
            p.requires_grad for p in self.module.parameters())
        return out.rebuild(lambda x: _torch_output(x, differentiable)
                           if isinstance(x, jax.Array) else x)

    def pipeline_layers(self, params: dict, buffers: dict, args: tuple, kwargs: dict, *,
                        train: bool) -> Layers:
        """The exported graph's layers (child modules such as ``blocks.0``), in order.

        A stage's carry is every value its layers (or earlier ones) computed that a
        later stage or the module's outputs still read, e.g. a residual stream and an
        attention mask; parameters are read where they are used, so a tied weight
        used by two stages is in both and its gradient is the sum of the two uses.
        Each layer's cost is the number of parameter elements it reads plus its node
        count. Each layer's signature is its structural key
        (:meth:`torch_bridge.Program.layer_signature`): the blocks of an
        ``nn.ModuleList`` of identical blocks share one, so weight streaming scans them;
        the last block, which hands on less (no attention mask), joins the scan through
        its projection (:meth:`torch_bridge.Program.layer_projection`).
        """
        program = self._program(args, kwargs, train)
        units = program.layers()
        nodes = [n for _, n in units]

        def stage(lo: int, hi: int) -> Stage:
            part = program.stage(nodes, lo, hi)

            def fn(p, b, carry, a, kw, key):
                leaves, _ = self.converted.flatten(a, kw)
                inputs = [to_jax(x) if is_array(x, torch=True) else x for x in leaves]
                out, mutated = part.run(p, b, carry, inputs, key)
                mutated = {n: v.astype(b[n].dtype) for n, v in mutated.items()}
                if part.last:
                    out = TorchOutputs(out, program.out_spec, program.side_calls)
                return out, mutated

            return Stage(fn, part.params, part.buffers)

        return Layers([name for name, _ in units], [program.layer_cost(n) for n in nodes],
                      stage, signature=lambda i: program.layer_signature(nodes, i),
                      projection=lambda i, j: program.layer_projection(nodes, i, j))

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
        # As cstorch's compile does: the module knows its backend's torch device
        # (``torch.tensor(0.).to(model.device)``), unless it has a ``device`` of its own.
        if not hasattr(self.module, "device"):
            self.module.device = compiled.backend.torch_device


def torch_model_adapter(module: torch.nn.Module) -> TorchModelAdapter:
    """The :class:`ModelAdapter` of a torch module (what ``cstorch.compile`` uses).

    Args:
      module: the torch module. Compiling it registers state-dict hooks on it (see
        ``cerebrax.models._torch_hooks``) and, where it has none, sets its ``device``
        attribute to the backend's torch device, as cstorch does.
    """
    return TorchModelAdapter(module)


def _torch_output(value: jax.Array, differentiable: bool) -> JaxTensor:
    """An output as a JaxTensor; a differentiable one as torch's autograd makes it."""
    tensor = JaxTensor(value)
    if not differentiable or not tensor.is_floating_point():
        return tensor
    with torch._C.DisableTorchFunction():  # no mode of the step sees this bookkeeping
        tensor.requires_grad_(True)
        return tensor.clone()  # a non-leaf, as a module's output is in torch
