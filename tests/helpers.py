"""Small models and data shared by the tests."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

import cerebrax as cstorch


def mlp_params(seed: int = 0, sizes=(8, 16, 4)) -> dict:
    keys = jax.random.split(jax.random.key(seed), len(sizes) - 1)
    params = {}
    for i, (k, n_in, n_out) in enumerate(zip(keys, sizes[:-1], sizes[1:])):
        params[f"fc{i + 1}"] = {
            "weight": jax.random.normal(k, (n_in, n_out)) / np.sqrt(n_in),
            "bias": jnp.full((n_out,), 0.01 * (i + 1)),
        }
    return params


def mlp_apply(params: dict, x: jax.Array) -> jax.Array:
    n = len(params)
    for i in range(n):
        layer = params[f"fc{i + 1}"]
        x = x @ layer["weight"] + layer["bias"]
        if i < n - 1:
            x = jax.nn.tanh(x)
    return x


def xent(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def batches(n: int = 20, batch: int = 32, features: int = 8, classes: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    xs = rng.normal(size=(n, batch, features)).astype(np.float32)
    ys = rng.integers(0, classes, size=(n, batch)).astype(np.int32)
    return list(zip(xs, ys))


def compiled_mlp(backend="CPU", seed: int = 0) -> cstorch.CompiledModel:
    return cstorch.compile(cstorch.FunctionalModel(mlp_apply, mlp_params(seed)), backend)


def rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def max_rel_tree(a: dict, b: dict) -> float:
    return max(rel_err(a[k], b[k]) for k in b)


def flat_params(params: dict) -> dict:
    return {f"{layer}.{name}": np.asarray(v)
            for layer, d in params.items() for name, v in d.items()}


def xent_step(model: cstorch.CompiledModel, optimizer, loss_fn=None, *,
              zero_grad: bool = False) -> cstorch.TracedStep:
    """The plain traced training step: loss (cross-entropy unless ``loss_fn`` is given),
    backward, optimizer step (and ``optimizer.zero_grad()`` if asked)."""
    loss_fn = xent if loss_fn is None else loss_fn

    @cstorch.trace
    def training_step(x, y):
        loss = loss_fn(model(x), y)
        cstorch.backward(loss)
        optimizer.step()
        if zero_grad:
            optimizer.zero_grad()
        return loss

    return training_step


def fresh_backend(cluster: dict | None = None) -> cstorch.Backend:
    """A fresh float32 run: the CPU backend, or a CSX one with ``ClusterConfig(**cluster)``."""
    cstorch.reset()
    cstorch.amp.set_half_dtype("float32")
    if cluster is None:
        return cstorch.backend("CPU")
    return cstorch.backend("CSX", cluster_config=cstorch.distributed.ClusterConfig(**cluster))


def per_system_input_fn(data: list):
    """An ``input_fn`` over ``data`` (a list of ``(x, y)`` global batches) in which each
    streaming worker (one per system) streams its own contiguous rows, so the
    concatenated global batch is ``data``'s batch, not one copy per system."""
    import cerebrax as cstorch

    def input_fn():
        dist = cstorch.distributed
        if not dist.is_streamer() or dist.num_streamers() == 1:
            return data
        n, rank = dist.num_streamers(), dist.get_streaming_rank()
        rows = slice(rank * len(data[0][0]) // n, (rank + 1) * len(data[0][0]) // n)
        return [(x[rows], y[rows]) for x, y in data]

    return input_fn


# cstorch's AdamW defaults where they differ from torch's: a torch reference built with
# these trains like cstorch.optim.AdamW built with its defaults.
CSTORCH_ADAMW = dict(eps=1e-6, weight_decay=0.0)
