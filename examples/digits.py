"""The digits job's pieces: model factory, input function and loss.

`configs/digits_mlp.yaml` names these by import path (`examples.digits:mlp`,
`examples.digits:input_fn`, `examples.digits:loss_fn`), so `cerebrax fit` builds the same
job that a hand-written cstorch loop builds from them. The data is scikit-learn's
handwritten digits (no download): 1,797 8x8 images, 360 of them held out.
"""

from __future__ import annotations

import jax
import numpy as np
import optax
from flax import nnx

__all__ = ["MLP", "input_fn", "loss_fn", "mlp", "split_digits"]

NUM_TEST = 360  # 20% of the 1,797 digits, a multiple of the evaluation batch


class MLP(nnx.Module):
    """Three dense layers, 64 -> hidden -> hidden -> 10, with ReLU between them."""

    def __init__(self, rngs: nnx.Rngs, hidden: int = 128):
        self.fc1 = nnx.Linear(64, hidden, rngs=rngs)
        self.fc2 = nnx.Linear(hidden, hidden, rngs=rngs)
        self.fc3 = nnx.Linear(hidden, 10, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = jax.nn.relu(self.fc1(x))
        x = jax.nn.relu(self.fc2(x))
        return self.fc3(x)


def mlp(hidden: int = 128, seed: int = 0) -> MLP:
    """The model factory of the config: an :class:`MLP` initialized from ``seed``."""
    return MLP(nnx.Rngs(seed), hidden=hidden)


def split_digits(seed: int = 0) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """``(train, test)``, each ``(images (n, 64) float32 in [0, 1], labels (n,) int32)``."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    test, train = order[:NUM_TEST], order[NUM_TEST:]
    return (x[train], y[train]), (x[test], y[test])


def input_fn(
    split: str = "train", batch_size: int = 64, shuffle: bool = False, seed: int = 0
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The ``(images, labels)`` batches of one split, the last partial batch dropped.

    Each streaming worker calls this itself. The result is a list, so every epoch
    yields the same batches in the same order (a resumed run sees the same data).
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    train, test = split_digits()
    x, y = train if split == "train" else test
    if shuffle:
        order = np.random.default_rng(seed).permutation(len(x))
        x, y = x[order], y[order]
    n = len(x) // batch_size * batch_size  # drop_last: every batch has the same shape
    return [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, n, batch_size)]


def loss_fn(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy of integer labels."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
