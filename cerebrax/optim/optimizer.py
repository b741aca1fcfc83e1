"""``cstorch.optim.optimizer``: the ``Optimizer`` base class and ``ParamsT``, the type of
what an optimizer takes as its parameters (as ``torch.optim.optimizer.ParamsT``)."""

from ._base import Optimizer as Optimizer
from ._base import ParamsT as ParamsT

__all__ = ["Optimizer", "ParamsT"]
