"""The seam between ``cstorch.compile`` and the kinds of models it accepts.

A :class:`ModelAdapter` turns one kind of model (a :class:`~cerebrax.FunctionalModel`, a
``flax.nnx.Module``, a ``torch.nn.Module``) into flat named state and a pure apply
function. ``register_model_adapter`` teaches ``compile`` a new kind.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax

if TYPE_CHECKING:
    from ._compiled import CompiledModel

__all__ = ["ModelAdapter", "flatten_named"]


class ModelAdapter(abc.ABC):
    """Turns one kind of model into flat named state and a pure apply function.

    ``params`` and ``buffers`` map state-dict names (``"fc1.weight"``) to arrays.
    ``apply`` runs the model on those dicts and returns ``(outputs, new_buffers)``.
    """

    needs_key: bool = False
    # Whether the model is torch code: in a traced step its outputs are torch tensors.
    is_torch: bool = False

    @abc.abstractmethod
    def params(self) -> dict[str, Any]:
        """The model's parameters: ``{state-dict name: initial array}`` (JAX, numpy or
        torch arrays), in the order ``CompiledModel.parameters()`` lists them."""

    @abc.abstractmethod
    def buffers(self) -> dict[str, Any]:
        """The model's buffers (state that is not trained, e.g. batch-norm statistics):
        ``{state-dict name: initial array}``, empty when it has none."""

    @abc.abstractmethod
    def apply(self, params: dict, buffers: dict, args: tuple, kwargs: dict, *,
              train: bool, key: jax.Array | None) -> tuple[Any, dict]:
        """Runs the model on ``params`` and ``buffers`` as a pure function (it is traced).

        Args:
          params: ``{name: value}`` with the names of :meth:`params`.
          buffers: ``{name: value}`` with the names of :meth:`buffers`.
          args: the call's positional inputs, as JAX values.
          kwargs: the call's keyword inputs, as JAX values.
          train: whether the model is in train mode.
          key: this call's ``jax.random`` key when :attr:`needs_key`, else None.

        Returns:
          ``(outputs, new_buffers)``: the outputs, a JAX pytree (see :meth:`outputs`),
          and the buffers' new values by name.
        """

    def initial_key(self) -> jax.Array:
        """The model's first ``jax.random`` key (when :attr:`needs_key`); split per call."""
        return jax.random.key(0)

    def outputs(self, out: Any, *, torch_tensors: bool) -> Any:
        """What a call returns, from what :meth:`apply` returned.

        ``apply`` returns a JAX pytree (it crosses ``jax.jit``); a model whose outputs
        are containers JAX does not know rebuilds them here. ``torch_tensors``: the
        call is in a traced step on torch inputs, and torch code reads the outputs.
        """
        return out

    def calling_with(self, args: tuple, kwargs: dict) -> contextlib.AbstractContextManager:
        """A block that traces one call on ``(args, kwargs)``, as given by the caller
        (before torch tensors become JAX values): a torch model keeps its inputs' torch
        integer dtypes there. Nothing to keep for other models."""
        return contextlib.nullcontext()

    def parameter_aliases(self) -> Mapping[Any, str]:
        """``{original parameter object: name}``, for optimizers given those objects.

        The objects (e.g. a torch module's ``nn.Parameter``) must be weakly referable:
        cerebrax keeps the link only while the original object lives.
        """
        return {}

    def state_dict_order(self, params: list[str], buffers: list[str]) -> list[str]:
        """The names of ``state_dict()`` in order, aliases (see below) included."""
        return params + buffers

    def state_dict_aliases(self) -> dict[str, str]:
        """Extra state-dict names of stored values: ``{alias: stored name}``.

        A tied weight is stored once but, as in torch, appears in the state dict under
        every name (``{"lm_head.weight": "wte.weight"}``).
        """
        return {}

    def frozen_parameters(self) -> set[str]:
        """Names of parameters that are not trained (torch's ``requires_grad=False``)."""
        return set()

    def is_training(self) -> bool | None:
        """The model's own train/eval flag, or None when the compiled model keeps it."""
        return None

    def set_training(self, mode: bool) -> None:
        """Switches the model's own train/eval flag (when :meth:`is_training` has one)."""

    def attach(self, compiled: CompiledModel) -> None:
        """Called once the compiled model exists (e.g. to hook the original model)."""

    def pipeline_layers(self, params: dict, buffers: dict, args: tuple, kwargs: dict, *,
                        train: bool) -> Any:
        """The model's layers for pipeline mode (a :class:`cerebrax.wse.Layers`).

        ``args`` and ``kwargs`` look like one micro-batch's inputs (array leaves may be
        ``jax.ShapeDtypeStruct``). None (the default) means the model has no layers to
        split; pipeline mode then raises a :class:`ConfigError` naming the fix.
        """
        return None


def flatten_named(tree: Any) -> tuple[dict[str, Any], Any]:
    """``tree``'s leaves by dotted name (``{"fc1.weight": leaf}``) and its treedef."""
    pairs, treedef = jax.tree_util.tree_flatten_with_path(tree)
    named = {}
    for path, leaf in pairs:
        # flax.nnx variables flatten to `.value` attributes: name them by their path.
        path = tuple(k for k in path
                     if not (isinstance(k, jax.tree_util.GetAttrKey) and k.name == "value"))
        name = jax.tree_util.keystr(path, simple=True, separator=".")
        named[name or "param"] = leaf
    return named, treedef
