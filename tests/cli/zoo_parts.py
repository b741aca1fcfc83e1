"""A tiny model and data for the Model Zoo config tests, named by file path in configs."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, hidden: int):
        self.fc1 = nnx.Linear(8, hidden, rngs=rngs)
        self.fc2 = nnx.Linear(hidden, 4, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(jax.nn.relu(self.fc1(x)))


def mlp(hidden: int = 16, seed: int = 0) -> MLP:
    return MLP(nnx.Rngs(seed), hidden)


def blobs(split: str = "train", batch_size: int = 16, shuffle: bool = False, seed: int = 0):
    """Four separable clusters in 8 dimensions: 7 training batches, 4 test batches."""
    centers = np.random.default_rng(123).normal(size=(4, 8)).astype(np.float32) * 3
    n = 7 * batch_size if split == "train" else 4 * batch_size
    rng = np.random.default_rng(seed if split == "train" else 1000)
    y = rng.integers(0, 4, size=n).astype(np.int32)
    x = centers[y] + rng.normal(size=(n, 8)).astype(np.float32)
    if shuffle:
        order = rng.permutation(n)
        x, y = x[order], y[order]
    return [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, n, batch_size)]
