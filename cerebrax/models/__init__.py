"""Model wrapping: ``cstorch.compile`` and the kinds of models it accepts.

:func:`compile` turns a :class:`FunctionalModel`, a ``flax.nnx.Module`` or a
``torch.nn.Module`` into a :class:`CompiledModel` whose parameters and buffers live in
registered state. Each kind of model is an adapter behind one seam,
:class:`ModelAdapter`; ``register_model_adapter`` adds a kind. The torch adapter
(:mod:`._torch`) loads the torch bridge only when a torch module is compiled.
"""

from ._adapter import ModelAdapter as ModelAdapter
from ._adapter import flatten_named as flatten_named
from ._compiled import CompiledModel as CompiledModel
from ._compiled import IncompatibleKeys as IncompatibleKeys
from ._compiled import compile as compile  # noqa: A004
from ._compiled import register_model_adapter as register_model_adapter
from ._compiled import resolve_parameter as resolve_parameter
from ._functional import FunctionalModel as FunctionalModel
from ._sequential import LayerFn as LayerFn
from ._sequential import run_sequential as run_sequential
from ._sequential import sequential_layers as sequential_layers


def __getattr__(name: str):
    # The torch adapter imports torch: it loads on first use, not with cerebrax.
    if name in ("TorchModelAdapter", "torch_model_adapter"):
        from . import _torch

        return getattr(_torch, name)
    raise AttributeError(f"module 'cerebrax.models' has no attribute {name!r}")
