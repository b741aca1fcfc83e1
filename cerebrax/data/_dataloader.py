"""``DataLoader``: a cstorch data loader built from an ``input_fn``.

Every streaming worker calls ``input_fn`` itself to build its own iterable (a torch
DataLoader, or any iterable of numpy / torch / JAX batches, nested tuples and dicts
included). The loader yields a fixed number of steps, restarting the iterable at the
end of each epoch, with every array leaf converted to a JAX array on the backend's
device.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from ..errors import ConfigError

__all__ = ["DataLoader", "compute_num_steps"]


def _check_count(name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"DataLoader({name}=...) must be an integer > 0, got {value!r}.")


def compute_num_steps(
    length: int | None,
    *,
    num_steps: int | None = None,
    max_steps: int | None = None,
    num_epochs: int | None = None,
    steps_per_epoch: int | None = None,
) -> int:
    """The number of steps a run takes (cstorch's rules).

    ``num_steps`` and ``num_epochs`` are exclusive; ``steps_per_epoch`` defaults to the
    length of the data; the result is the minimum of ``num_epochs * steps_per_epoch``,
    ``num_steps`` and ``max_steps`` over those given.
    """
    for name, value in (("num_steps", num_steps), ("max_steps", max_steps),
                        ("num_epochs", num_epochs), ("steps_per_epoch", steps_per_epoch)):
        _check_count(name, value)
    if num_steps is not None and num_epochs is not None:
        raise ConfigError("Only one of num_steps and num_epochs may be given.")
    candidates = []
    if num_epochs is not None:
        spe = steps_per_epoch if steps_per_epoch is not None else length
        if spe is None:
            raise ConfigError(
                "num_epochs needs steps_per_epoch when the data has no length (an "
                "iterable without __len__)."
            )
        if length is not None and spe > length:
            raise ConfigError(
                f"steps_per_epoch={spe} is larger than the number of batches ({length})."
            )
        candidates.append(num_epochs * spe)
    if num_steps is not None:
        candidates.append(num_steps)
    if max_steps is not None:
        candidates.append(max_steps)
    if not candidates:
        if length is None:
            raise ConfigError(
                "Could not infer the number of steps: give num_steps (or num_epochs with "
                "steps_per_epoch) to the DataLoader or to the DataExecutor."
            )
        return length
    return min(candidates)


def _convert(leaf: Any, device: jax.Device | None) -> Any:
    if isinstance(leaf, jax.Array):
        return leaf
    if type(leaf).__module__.startswith("torch") or isinstance(leaf, (np.ndarray, np.generic)):
        from .._interop import to_numpy

        return jax.device_put(to_numpy(leaf), device)
    return leaf


def to_device(batch: Any, device: jax.Device | None = None) -> Any:
    """``batch`` with every numpy / torch array leaf placed on ``device`` as a JAX array."""
    return jax.tree.map(
        lambda x: _convert(x, device), batch,
        is_leaf=lambda x: type(x).__module__.startswith("torch"),
    )


class DataLoader:
    """Wraps an ``input_fn`` that builds the data iterable (cstorch's DataLoader).

    Args:
      input_fn: called as ``input_fn(*args, **kwargs)``; returns a torch DataLoader or
        any iterable of batches.
      num_steps, max_steps, num_epochs, steps_per_epoch: how many steps to yield
        (see :func:`compute_num_steps`). These four names are the loader's own: they
        are never passed on to ``input_fn``; every other argument is.

    Iterating the loader directly runs an implicit ``DataExecutor`` (with the
    ``checkpoint_steps`` of ``cstorch.configure``), so the seeds' plain
    ``for batch in dataloader`` loops work.
    """

    def __init__(
        self,
        input_fn: Callable[..., Any],
        *args: Any,
        num_steps: int | None = None,
        max_steps: int | None = None,
        num_epochs: int | None = None,
        steps_per_epoch: int | None = None,
        **kwargs: Any,
    ):
        if not callable(input_fn):
            raise ConfigError(
                f"DataLoader expects a callable input_fn that builds the data, got "
                f"{type(input_fn).__name__}. Wrap the data: DataLoader(lambda: data)."
            )
        for name, value in (("num_steps", num_steps), ("max_steps", max_steps),
                            ("num_epochs", num_epochs), ("steps_per_epoch", steps_per_epoch)):
            _check_count(name, value)
        if num_steps is not None and num_epochs is not None:
            raise ConfigError("Only one of num_steps and num_epochs may be given.")
        self.input_fn = input_fn
        self.input_fn_args = args
        self.input_fn_kwargs = kwargs
        self._counts = dict(num_steps=num_steps, max_steps=max_steps,
                            num_epochs=num_epochs, steps_per_epoch=steps_per_epoch)
        self._source: Any = None

    @property
    def source(self) -> Any:
        """The iterable built by ``input_fn`` (built once, on first use)."""
        if self._source is None:
            self._source = self.input_fn(*self.input_fn_args, **self.input_fn_kwargs)
        return self._source

    @property
    def num_steps(self) -> int:
        try:
            length = len(self.source)
        except TypeError:
            length = None
        return compute_num_steps(length, **self._counts)

    def __len__(self) -> int:
        return self.num_steps

    def batches(self, device: jax.Device | None = None) -> Iterator[Any]:
        """Batches on ``device`` without end, restarting the iterable every epoch."""
        while True:
            empty = True
            for batch in self.source:
                empty = False
                yield to_device(batch, device)
            if empty:
                raise ConfigError("The DataLoader's input_fn produced no batches.")
            if iter(self.source) is self.source:
                raise ConfigError(
                    "The DataLoader's input_fn returned an iterator that is exhausted after "
                    "one pass. Return a re-iterable object (a list, a torch DataLoader) or "
                    "give num_steps no larger than one epoch."
                )

    def __iter__(self) -> Iterator[Any]:
        from ._executor import DataExecutor

        yield from DataExecutor(self)
