"""``from_torch``: the cerebrax optimizer equivalent to a ``torch.optim`` optimizer."""

from __future__ import annotations

import inspect
from typing import Any

from ..errors import ConfigError
from ._base import Optimizer

__all__ = ["from_torch"]

# The torch.optim classes whose cerebrax namesakes have torch's signature and numerics
# (tests/optim/test_optimizers_vs_torch.py runs each against torch).
TORCH_EQUIVALENTS = ("ASGD", "Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax",
                     "NAdam", "RAdam", "RMSprop", "Rprop", "SGD")


def from_torch(optimizer: Any) -> Optimizer:
    """The cerebrax optimizer of the same class, parameters, groups and state.

    ``torch.optim.X(params, **kwargs)`` becomes ``cstorch.optim.X`` over the same
    parameters (torch parameters of a module given to ``cstorch.compile``), with the
    torch optimizer's constructor arguments, its param groups and their
    hyperparameters, and its state (momentum buffers, moments, step counts), so a run
    can continue where torch left it. Every hyperparameter is passed explicitly from
    the torch optimizer, so where cstorch's defaults differ from torch's (``eps=1e-6``
    for Adam, ...) the torch optimizer's own values are kept. The torch optimizer is
    not changed.

    Raises:
      ConfigError: ``optimizer`` is not a torch optimizer, or cerebrax has no
        optimizer of its class.

    Example:
      >>> import torch, cerebrax as cstorch
      >>> module = torch.nn.Linear(3, 2)
      >>> model = cstorch.compile(module, "CPU")
      >>> torch_sgd = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
      >>> type(cstorch.optim.from_torch(torch_sgd)).__name__
      'SGD'
    """
    from .. import optim

    optimizers = vars(optim)

    name = type(optimizer).__name__
    torch_optim = type(optimizer).__module__.startswith("torch.optim")
    if not torch_optim or name not in TORCH_EQUIVALENTS:
        raise ConfigError(
            f"cstorch.optim.from_torch() converts a torch.optim optimizer of one of "
            f"{', '.join(TORCH_EQUIVALENTS)}; got {name} (from "
            f"{type(optimizer).__module__}). Fix: build the cerebrax optimizer directly, "
            f"e.g. cstorch.optim.SGD(model.parameters(), lr=...)."
        )
    cls = optimizers[name]
    accepted = inspect.signature(cls).parameters
    # torch's values, all of them: none of cstorch's defaults may apply.
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    converted = cls([{"params": list(group["params"])} for group in optimizer.param_groups],
                    **defaults)
    # The groups' own hyperparameters (lr, weight_decay, ...) and the state.
    converted.load_state_dict(optimizer.state_dict())
    return converted
