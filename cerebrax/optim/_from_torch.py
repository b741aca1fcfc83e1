"""``from_torch``: the cerebrax optimizer equivalent to a ``torch.optim`` optimizer.

The conversion carries every option torch's class uses, per param group, and refuses
one it cannot honour: an option of torch's ``defaults`` that the cerebrax class does not
take and that is not one of :data:`HARMLESS_OPTIONS` is an error when it is not at
torch's default, never dropped. Keys of a param group that torch's class does not read
either (a scheduler's ``initial_lr``, a user's own keys) change nothing and are not
carried. :func:`check_convertible` runs the same checks without building anything; a
traced step uses it to refuse a torch optimizer at trace time
(:mod:`cerebrax.optim._torch_in_step`).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from ._adafactor import Adafactor
from ._base import Optimizer
from ._torch_optimizers import (ASGD, SGD, Adadelta, Adagrad, Adam, Adamax, AdamW, NAdam,
                                RAdam, RMSprop, Rprop)

__all__ = ["HARMLESS_OPTIONS", "TORCH_EQUIVALENTS", "check_convertible", "from_torch"]

# The torch.optim classes whose cerebrax namesakes have torch's signature and numerics
# (tests/optim/test_optimizers_vs_torch.py runs each against torch).
_CLASSES: dict[str, type[Optimizer]] = {cls.__name__: cls for cls in (
    ASGD, Adadelta, Adafactor, Adagrad, Adam, AdamW, Adamax, NAdam, RAdam, RMSprop, Rprop, SGD)}
TORCH_EQUIVALENTS = tuple(sorted(_CLASSES))

# torch options that choose an implementation, not the numbers: the whole step is one
# fused program. AdamW's ``decoupled_weight_decay`` is always True there (AdamW is
# decoupled by definition).
HARMLESS_OPTIONS = {"foreach": None, "fused": None, "capturable": None,
                    "decoupled_weight_decay": "AdamW"}

MSG_NOT_CONVERTIBLE = """\
cstorch.optim.from_torch() converts a torch.optim optimizer of one of
{supported}; got {name} (from {module}).
Fix: build the cerebrax optimizer directly, e.g.
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
or use a supported torch optimizer (a subclass of one may change its update, so it is
not converted either)."""

MSG_OPTION = """\
torch.optim.{name}(..., {key}={value!r}) changes the update, and cstorch.optim.{name}
has no such option, so cstorch.optim.from_torch() cannot convert it without training
differently. Fix: {fix}, or write the update as a custom cstorch.optim.Optimizer
(preinitialize / step)."""


def _is_torch_optimizer(optimizer: Any) -> bool:
    module = type(optimizer).__module__
    return module.startswith("torch.optim") and type(optimizer).__name__ in TORCH_EQUIVALENTS


def _torch_default(optimizer: Any, key: str) -> Any:
    """The default of ``key`` in the torch class's signature (``inspect.Parameter.empty``
    where the class has no such argument)."""
    for cls in type(optimizer).__mro__:
        if cls.__module__.startswith("torch.optim") and "__init__" in vars(cls):
            param = inspect.signature(cls.__init__).parameters.get(key)
            return inspect.Parameter.empty if param is None else param.default
    return inspect.Parameter.empty


def _accepted(name: str) -> Mapping[str, inspect.Parameter]:
    return inspect.signature(_CLASSES[name]).parameters


def _options(optimizer: Any, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (torch's defaults or a group) as arguments of the cerebrax class:
    torch's keys the class takes, with every other key of torch's defaults checked."""
    name = type(optimizer).__name__
    accepted = _accepted(name)
    out = {}
    for key, value in values.items():
        if key == "params" or key not in optimizer.defaults:
            continue  # a key torch's class does not read either
        if key in accepted:
            out[key] = _plain(value)
        elif not _harmless(name, key) and value != _torch_default(optimizer, key):
            default = _torch_default(optimizer, key)
            fix = (f"remove {key}" if default is inspect.Parameter.empty
                   else f"leave {key} at torch's default ({default!r})")
            raise ConfigError(MSG_OPTION.format(name=name, key=key, value=value, fix=fix))
    return out


def _harmless(name: str, key: str) -> bool:
    return key in HARMLESS_OPTIONS and HARMLESS_OPTIONS[key] in (None, name)


def _plain(value: Any) -> Any:
    """A hyperparameter as a Python value (torch allows 1-element tensors for some)."""
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if type(value).__module__.startswith("torch") and hasattr(value, "item"):
        return value.item()  # a host tensor: its value is known here
    return value


def check_convertible(optimizer: Any) -> None:
    """Raises :class:`~cerebrax.errors.ConfigError` if :func:`from_torch` would refuse
    ``optimizer`` for its class or an option (it builds nothing)."""
    if not _is_torch_optimizer(optimizer):
        raise ConfigError(MSG_NOT_CONVERTIBLE.format(
            supported=", ".join(TORCH_EQUIVALENTS), name=type(optimizer).__name__,
            module=type(optimizer).__module__))
    _options(optimizer, optimizer.defaults)
    for group in optimizer.param_groups:
        _options(optimizer, group)


def from_torch(optimizer: Any) -> Optimizer:
    """The cerebrax optimizer of the same class, parameters, groups and state.

    ``torch.optim.X(params, **kwargs)`` becomes ``cstorch.optim.X`` over the same
    parameters (torch parameters of a module given to ``cstorch.compile``), with the
    torch optimizer's constructor arguments, each param group's hyperparameters, and
    its state (momentum buffers, moments, step counts), so a run can continue where
    torch left it. Every hyperparameter is passed explicitly from the torch optimizer,
    so where cstorch's defaults differ from torch's (``eps=1e-6`` for Adam, ...) the
    torch optimizer's own values are kept. An option torch uses that cerebrax does not
    honour is refused, not dropped; ``foreach``, ``fused`` and ``capturable`` choose an
    implementation only and are ignored. The torch optimizer is not changed.

    A torch optimizer stepped inside a traced step is converted by the step itself, and
    then stands for the converted one; ``from_torch`` of it returns that one.

    Raises:
      ConfigError: ``optimizer`` is not a torch optimizer, cerebrax has no optimizer of
        its class, or it uses an option cerebrax does not honour.

    Example:
      >>> import torch, cerebrax as cstorch
      >>> module = torch.nn.Linear(3, 2)
      >>> model = cstorch.compile(module, "CPU")
      >>> torch_sgd = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
      >>> type(cstorch.optim.from_torch(torch_sgd)).__name__
      'SGD'
    """
    current = _current_conversion(optimizer)
    if current is not None:
        return current
    check_convertible(optimizer)
    cls = _CLASSES[type(optimizer).__name__]
    groups = [{**_options(optimizer, group), "params": list(group["params"])}
              for group in optimizer.param_groups]
    converted = cls(groups, **_options(optimizer, optimizer.defaults))
    converted.load_state_dict(optimizer.state_dict())  # the state (and groups' values)
    return converted


def _current_conversion(optimizer: Any) -> Optimizer | None:
    """The cerebrax optimizer a torch optimizer stands for since a traced step
    converted it, while that one is of the current generation (not reset)."""
    conversion = getattr(optimizer, "__dict__", {}).get("_cerebrax")
    return None if conversion is None else conversion.current()
