"""The 1.2-era entry points of seed 003: ``import cerebrax.legacy as cbtorch``.

A PyTorch training loop ports with four additions: ``cbtorch.initialize()``, the model
wrapped by ``cbtorch.module``, the data loader by ``cbtorch.dataloader``, and the loop
inside ``with cbtorch.Session(model, optimizer, criterion, mode="train")``. The body
stays a standard PyTorch loop; each iteration runs as one compiled ``cstorch.trace``
step (see :class:`Session`).
"""

from ._dataloader import LegacyDataLoader as LegacyDataLoader
from ._dataloader import dataloader as dataloader
from ._initialize import initialize as initialize
from ._lazy import LazyTensor as LazyTensor
from ._module import LegacyModule as LegacyModule
from ._module import module as module
from ._session import Session as Session
from ._session import active_session as active_session
