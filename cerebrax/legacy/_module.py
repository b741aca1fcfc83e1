"""``cbtorch.module(m)``: a model whose calls are captured inside a Session."""

from __future__ import annotations

from typing import Any

from .._filters import is_torch_module
from .._runtime import RUNTIME
from ..models import CompiledModel
from ..models import compile as compile_model
from ..errors import ConfigError

__all__ = ["LegacyModule", "module"]


class LegacyModule:
    """A model prepared for a :class:`~cerebrax.legacy.Session` (``cbtorch.module``).

    It wraps a :class:`cerebrax.CompiledModel` and behaves like the module it wraps:
    ``parameters()`` (give them to a ``cstorch.optim`` or ``torch.optim`` optimizer),
    ``state_dict()``,
    ``load_state_dict()``, ``train()``, ``eval()``. Inside an open Session a call
    returns a :class:`~cerebrax.legacy.LazyTensor` and becomes part of the Session's
    compiled step; outside one it runs the model right away on the current weights.

    Attributes:
      compiled: the :class:`cerebrax.CompiledModel` holding the weights.
    """

    def __init__(self, compiled: CompiledModel):
        self.compiled = compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        sessions = RUNTIME.sessions  # the running Session's with-block, innermost last
        if not sessions:
            return self.compiled(*args, **kwargs)
        return sessions[-1]._record_model_call(self, args, kwargs)

    def train(self, mode: bool = True) -> LegacyModule:
        """Sets train (``mode=True``) or eval mode of the compiled model; returns self."""
        self.compiled.train(mode)
        return self

    def eval(self) -> LegacyModule:
        """Sets eval mode; returns self."""
        return self.train(False)

    @property
    def training(self) -> bool:
        """Whether the model is in train mode."""
        return self.compiled.training

    def parameters(self) -> list:
        """The parameters to build the optimizer from: a torch model's own
        ``torch.nn.Parameter`` objects (which ``torch.optim`` and ``cstorch.optim`` both
        take), else the compiled model's."""
        original = self.compiled.model
        if is_torch_module(original):
            return list(original.parameters())
        return self.compiled.parameters()

    def named_parameters(self) -> Any:
        """``(name, parameter)`` pairs of the same parameters :meth:`parameters` gives."""
        original = self.compiled.model
        if is_torch_module(original):
            return original.named_parameters()
        return self.compiled.named_parameters()

    def __getattr__(self, name: str) -> Any:
        # parameters, named_parameters, buffers, state_dict, load_state_dict, model, ...
        if name == "compiled":  # not set yet (e.g. during unpickling)
            raise AttributeError(name)
        return getattr(self.compiled, name)

    def __repr__(self) -> str:
        return f"cbtorch.module({self.compiled!r})"


def module(model: Any, backend: Any = None) -> LegacyModule:
    """Prepares a model for a Session loop (seed 003's ``cbtorch.module(Model())``).

    Args:
      model: a ``torch.nn.Module`` (converted through the torch bridge), a
        ``flax.nnx.Module``, a :class:`cerebrax.FunctionalModel`, or an already
        compiled :class:`cerebrax.CompiledModel`.
      backend: as in :func:`cerebrax.compile`; None uses the backend that
        :func:`~cerebrax.legacy.initialize` created, or a CPU one.

    Returns:
      A :class:`LegacyModule`. Build the optimizer from its ``parameters()`` (or from
      the original torch module's).

    Example:
      >>> import cerebrax.legacy as cbtorch
      >>> model = cbtorch.module(torch.nn.Linear(4, 2))
      >>> optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
      >>> model
      cbtorch.module(CompiledModel(Linear, 2 parameters, 10 values, backend=CPU))
    """
    if isinstance(model, LegacyModule):
        raise ConfigError("cbtorch.module() got a model that is already wrapped by it.")
    compiled = model if isinstance(model, CompiledModel) else compile_model(model, backend)
    return LegacyModule(compiled)
