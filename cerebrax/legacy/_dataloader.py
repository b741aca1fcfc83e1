"""``cbtorch.dataloader(dl)``: the PyTorch data loader of a Session loop."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["LegacyDataLoader", "dataloader"]


class LegacyDataLoader:
    """A data loader for a Session loop (seed 003's ``cbtorch.dataloader(...)``).

    Each ``for`` loop over it is one ``for`` loop over the wrapped loader, so epochs,
    shuffling and worker processes behave exactly as in PyTorch, and the batches are
    the loader's own (torch tensors stay torch tensors; the step takes them without a
    copy where it can). Moving to the next batch ends a pending Session step: in eval
    mode, the body's step runs there unless a read of a value ran it already.

    Every batch must have the same shape (build the torch loader with
    ``drop_last=True``): the Session's step compiles once, and a new shape raises
    :class:`cerebrax.RecompileError`.

    Attributes:
      data: the wrapped loader (a torch ``DataLoader``, a list of batches, ...).
    """

    def __init__(self, data: Any):
        if not hasattr(data, "__iter__"):
            from ..errors import ConfigError

            raise ConfigError(
                f"cbtorch.dataloader() expects a PyTorch DataLoader (or another iterable of "
                f"batches), got {type(data).__name__}."
            )
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self) -> Iterator[Any]:
        from ._session import active_session

        for batch in self.data:
            yield batch
            # The loop body is done: its step runs before the next batch is read.
            session = active_session()
            if session is not None and session._pending is not None:
                session.mark_step()


def dataloader(data: Any) -> LegacyDataLoader:
    """Wraps a PyTorch data loader for a Session loop (``cbtorch.dataloader``).

    Args:
      data: the standard PyTorch ``DataLoader`` (or any iterable of batches of numpy,
        torch or JAX arrays). Build it with ``drop_last=True``: a compiled step takes
        one batch shape.

    Returns:
      A :class:`LegacyDataLoader`.
    """
    return LegacyDataLoader(data)
