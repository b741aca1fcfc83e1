"""Argument checks shared by the metrics: class counts, ignored classes, batch shapes."""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError

__all__ = [
    "batch_weights",
    "broadcast_weights",
    "check_num_classes",
    "check_positive",
    "class_mask",
]


def _as_index(value: Any) -> int | None:
    """``value`` as an int where ``operator.index`` takes it and it is no bool, else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_num_classes(metric: str, num_classes: Any, *, minimum: int) -> int:
    """``num_classes`` as an int, or a ConfigError if it is not an int ``>= minimum``."""
    value = _as_index(num_classes)
    if value is None:
        raise ConfigError(f"{metric}: `num_classes` must be an integer, got {num_classes!r}.")
    if value < minimum:
        raise ConfigError(
            f"{metric}: `num_classes` must be at least {minimum}, got {num_classes=}."
        )
    return value


def check_positive(metric: str, arg: str, value: Any) -> float:
    """``value`` as a float, or a ConfigError if it is not a finite number ``> 0``."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{metric}: `{arg}` must be a number, got {value!r}.") from None
    if not (math.isfinite(number) and number > 0):
        raise ConfigError(f"{metric}: `{arg}` must be a positive number, got {arg}={value!r}.")
    return number


def class_mask(metric: str, arg: str, num_classes: int, ignore: Any) -> np.ndarray:
    """A float32 ``[num_classes]`` mask: 0 for the classes listed in ``ignore``, else 1.

    ``ignore`` is None, one class index, or an iterable of class indices; each must lie
    in ``[0, num_classes)`` and at least one class must remain. The mask is a NumPy
    constant, so it is baked into the compiled step.
    """
    mask = np.ones(num_classes, np.float32)
    if ignore is None:
        return mask
    items = [ignore] if not isinstance(ignore, Iterable) else list(ignore)
    for item in items:
        index = _as_index(item)
        if index is None:
            raise ConfigError(
                f"{metric}: `{arg}` must hold class indices (ints), got {item!r} in "
                f"{arg}={ignore!r}."
            )
        if not 0 <= index < num_classes:
            raise ConfigError(
                f"{metric}: class {index} in {arg}={ignore!r} is out of range; classes "
                f"are 0 to {num_classes - 1} (num_classes={num_classes})."
            )
        mask[index] = 0
    if not mask.any():
        raise ConfigError(
            f"{metric}: {arg}={ignore!r} ignores every one of the {num_classes} classes; "
            "leave at least one class to average over."
        )
    return mask


def batch_weights(
    metric: str, labels: jax.Array, predictions: jax.Array, weights: Any
) -> jax.Array:
    """The weights of one ``update(labels, predictions, weights)``: ``weights`` (1 where
    None) as float32 broadcast to the labels' shape.

    A ConfigError where ``predictions`` has not the shape of ``labels``, or where
    ``weights`` does not broadcast to it.
    """
    if jnp.shape(predictions) != jnp.shape(labels):
        raise ConfigError(
            f"{metric}.update(): `labels` and `predictions` have mismatched shapes "
            f"{jnp.shape(labels)} and {jnp.shape(predictions)}; pass one class index per "
            "label (e.g. logits.argmax(-1))."
        )
    return broadcast_weights(metric, 1.0 if weights is None else weights, labels.shape)


def broadcast_weights(
    metric: str, weights: Any, shape: tuple[int, ...], *, arg: str = "weights"
) -> jax.Array:
    """``weights`` as float32 broadcast to ``shape``, or a ConfigError naming ``arg``."""
    weights = jnp.asarray(weights).astype(jnp.float32)
    try:
        return jnp.broadcast_to(weights, shape)
    except ValueError:
        raise ConfigError(
            f"{metric}.update(): `{arg}` of shape {weights.shape} cannot be broadcast to "
            f"the shape {shape} it weighs."
        ) from None
