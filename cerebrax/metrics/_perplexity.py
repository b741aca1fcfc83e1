"""``PerplexityMetric``: exp of the mean loss per token of a language model."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ._base import Metric, as_float, divide_no_nan
from ._checks import broadcast_weights

__all__ = ["PerplexityMetric"]


class PerplexityMetric(Metric):
    """Perplexity over every batch since the last reset.

    ``update(labels, loss, weights=None)`` adds ``sum(loss)`` to the total loss and
    ``numel(labels)`` (or, with weights, ``sum([w > 0])``, weights broadcast to the
    labels' shape) to the token count; the value is
    ``exp(total_loss / total_tokens)``. ``loss`` is the batch's summed loss (a scalar)
    or its per-token losses; weights only decide which tokens are counted, so mask or
    weight the loss itself before passing it.

    Example:
      >>> ppl = cstorch.metrics.PerplexityMetric("ppl")
      >>> ppl.update(labels=jnp.zeros((2, 4)), loss=jnp.float32(8 * 0.5))
      >>> round(float(ppl), 4)  # exp(4 / 8)
      1.6487
    """

    def _initial_state(self) -> dict[str, jax.Array]:
        return {"total_loss": jnp.float32(0), "total_tokens": jnp.float32(0)}

    def _update(self, state, labels: Any, loss: Any, weights: Any = None) -> dict[str, jax.Array]:
        shape = jnp.shape(labels)
        if weights is None:
            tokens = jnp.float32(jnp.size(labels))
        else:
            weights = broadcast_weights(type(self).__name__, weights, shape)
            tokens = jnp.sum(as_float(weights > 0))
        return {
            "total_loss": state["total_loss"] + jnp.sum(as_float(loss)),
            "total_tokens": state["total_tokens"] + tokens,
        }

    def _compute(self, state) -> jax.Array:
        return jnp.exp(divide_no_nan(state["total_loss"], state["total_tokens"]))
