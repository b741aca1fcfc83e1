"""The Estimator's input rules (seed 002): ``input_fn(params)`` returns a dataset of
(features, labels) batches of one fixed batch size, that keeps providing batches until
the requested steps are done."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import numpy as np

from .._filters import is_array
from ..errors import ConfigError

__all__ = ["CheckedDataset", "check_input_fn", "make_dataset"]

MSG_SIGNATURE = """\
The input function only takes a single dictionary parameter, params, which the
Estimator passes from its constructor (Estimator(..., params=...)); got input_fn{sig}.

Wrong:
    def input_fn(params, mode):
Right:
    def input_fn(params):
        return batches_of(params["batch_size"])"""

MSG_NOT_DATASET = """\
Input function must return a dataset: a re-iterable collection of (features, labels)
batches, such as a torch DataLoader(..., drop_last=True), a list of batches, or a
generator that repeats; got {what}. (A single (features, labels) batch is not a
dataset.)"""

MSG_ELEMENT = """\
Each element of the dataset must be structured to consist of features and labels: a
(features, labels) pair where features is a tensor and labels is a tensor or None.
Batch {index} is {what}."""

MSG_BATCH_SIZE = """\
Inconsistent batch sizes detected: {detail}. To ensure a fixed batch size across all
steps, set `drop_remainder=True` when batching your Dataset in the input function
(a torch DataLoader: drop_last=True)."""

MSG_REPEAT = """\
The input function's dataset ran out after {count} batches, before the run's {steps}
steps were done. The Estimator takes the number of steps, not of epochs: the dataset
must keep providing batches until the steps are done (TensorFlow: dataset.repeat(),
count=None). Return a re-iterable dataset (a torch DataLoader or a list restarts every
pass), or make a generator repeat:

    def input_fn(params):
        def batches():
            while True:
                yield from make_batches(params)
        return batches()"""


def check_input_fn(input_fn: Callable[..., Any]) -> None:
    """Raises unless ``input_fn`` takes exactly one parameter, ``params``."""
    if not callable(input_fn):
        raise ConfigError(f"input_fn must be callable, got {type(input_fn).__name__}.")
    try:
        sig = inspect.signature(input_fn)
    except (TypeError, ValueError):
        return  # a builtin or extension callable: nothing to inspect
    params = list(sig.parameters.values())
    ok = len(params) == 1 and params[0].kind in (
        inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if not ok:
        raise ConfigError(MSG_SIGNATURE.format(sig=sig))


def _is_batch(x: Any) -> bool:
    return isinstance(x, (tuple, list)) and len(x) == 2 and is_array(x[0], torch=True)


def _describe(x: Any) -> str:
    if isinstance(x, (tuple, list)):
        kinds = ", ".join(type(v).__name__ for v in x)
        return f"a {type(x).__name__} of {len(x)} ({kinds})"
    return f"a {type(x).__name__}"


def make_dataset(input_fn: Callable[..., Any], params: Mapping[str, Any],
                 steps: int | None) -> CheckedDataset:
    """Calls ``input_fn(params)`` and checks that it returned a dataset.

    ``steps`` is the number of steps the run needs (for the message of a dataset that
    runs out before them), None for one pass.
    """
    dataset = input_fn(params)
    if (
        dataset is None
        or is_array(dataset, torch=True)
        or _is_batch(dataset)
        or isinstance(dataset, (str, bytes, Mapping))
        or not hasattr(dataset, "__iter__")
    ):
        raise ConfigError(MSG_NOT_DATASET.format(what=_describe(dataset)))
    return CheckedDataset(dataset, steps)


class CheckedDataset:
    """The dataset of an input function, checked element by element as it streams.

    Every element must be a ``(features, labels)`` pair of one fixed batch size; a
    one-shot iterable (a generator) may be read once, so it must repeat by itself.
    """

    def __init__(self, dataset: Any, steps: int | None = None):
        self.data = dataset
        self.one_shot = hasattr(dataset, "__next__")  # an iterator: one pass only
        self.count = 0
        self.steps = steps  # the steps the run needs (for the message)
        self._passes = 0
        self._batch_size: int | None = None

    def __len__(self) -> int:
        return len(self.data)  # TypeError when the dataset has no length

    def set_epoch(self, epoch: int) -> None:
        """Passes the epoch on to an epoch-aware sampler (a torch DistributedSampler)."""
        for obj in (self.data, getattr(self.data, "sampler", None)):
            set_epoch = getattr(obj, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(epoch)

    def has_length(self) -> bool:
        try:
            len(self.data)
        except TypeError:
            return False
        return True

    def __iter__(self) -> Iterator[Any]:
        if self.one_shot and self._passes:
            raise ConfigError(MSG_REPEAT.format(count=self.count, steps=self.steps))
        self._passes += 1
        for element in self.data:
            self.check(element)
            yield element

    def check(self, element: Any) -> None:
        index = self.count
        self.count += 1
        if not isinstance(element, (tuple, list)) or len(element) != 2:
            raise ConfigError(MSG_ELEMENT.format(index=index, what=_describe(element)))
        features, labels = element
        if not is_array(features, torch=True) or not (
                labels is None or is_array(labels, torch=True)):
            raise ConfigError(MSG_ELEMENT.format(index=index, what=_describe(element)))
        size = int(np.shape(features)[0]) if np.ndim(features) else 1
        if labels is not None and np.ndim(labels) and int(np.shape(labels)[0]) != size:
            raise ConfigError(MSG_BATCH_SIZE.format(
                detail=f"batch {index} has {size} features but {np.shape(labels)[0]} labels"))
        if self._batch_size is None:
            self._batch_size = size
        elif size != self._batch_size:
            raise ConfigError(MSG_BATCH_SIZE.format(
                detail=f"batch {index} has batch size {size}, the first batch had "
                f"{self._batch_size}"))
