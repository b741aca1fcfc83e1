"""``ClusterConfig(micro_batch_size=...)`` outside pipeline mode, on one device.

The model call runs over micro-batches in a scan with rematerialization: the same
losses as one call on the whole batch (no coupling between rows), less activation
memory, and BatchNorm statistics per micro-batch, as calls on the chunks one after
the other give them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    batches,
    fresh_backend,
    mlp_apply,
    mlp_params,
    rel_err,
    xent,
    xent_step,
)

import cerebrax as cstorch


def _backend(micro_batch_size=None, **fields):
    """CPU without micro-batches, else CSX with ``micro_batch_size`` (and ``fields``)."""
    if micro_batch_size is None and not fields:
        return fresh_backend()
    return fresh_backend(dict(micro_batch_size=micro_batch_size, **fields))


def _mlp_losses(micro_batch_size, steps=10, **fields):
    backend = _backend(micro_batch_size, **fields)
    model = cstorch.compile(cstorch.FunctionalModel(mlp_apply, mlp_params(0)), backend)
    step = xent_step(model, cstorch.optim.AdamW(model.parameters(), lr=1e-2))
    losses = [float(step(x, y)) for x, y in batches(steps)]
    return np.array(losses), model.state_dict(), step


@pytest.mark.parametrize("micro_batch_size, num_csx", [(8, 1), (4, 2), (32, 1)])
def test_micro_batches_train_like_the_whole_batch(micro_batch_size, num_csx):
    ref, ref_state, _ = _mlp_losses(None)
    losses, state, step = _mlp_losses(micro_batch_size, num_csx=num_csx)
    assert rel_err(losses, ref) <= 1e-6, (losses, ref)
    for name in ref_state:
        assert rel_err(state[name], ref_state[name]) <= 1e-6, name
    x, y = batches(1)[0]
    loops = step.lower(x, y).as_text().count("while")
    assert (loops > 0) == (micro_batch_size * num_csx < len(x)), loops


def test_smaller_micro_batches_need_less_activation_memory():
    sizes = (16, 512, 512, 512, 4)
    x, y = np.zeros((512, 16), np.float32), np.zeros((512,), np.int32)
    temps = []
    for micro in (None, 128, 32):
        backend = fresh_backend(dict(micro_batch_size=micro))
        model = cstorch.compile(cstorch.FunctionalModel(mlp_apply, mlp_params(0, sizes)),
                                backend)
        step = xent_step(model, cstorch.optim.SGD(model.parameters(), lr=0.1))
        temps.append(cstorch.wse.memory_report(step, x, y).temp_bytes)
    assert temps[0] > temps[1] > temps[2], temps
    # Three 512-wide activations of 512 rows are 3 MiB; micro-batches of 32 keep 1/16.
    assert temps[0] - temps[2] > 1.5 * 2**20, temps


def _bn_apply(params, buffers, x, train=True):
    """Linear -> BatchNorm (batch statistics in train mode) -> linear."""
    h = x @ params["w1"]
    if train:
        mean, var = h.mean(0), h.var(0)
        momentum = 0.1
        buffers = {"mean": (1 - momentum) * buffers["mean"] + momentum * mean,
                   "var": (1 - momentum) * buffers["var"] + momentum * var}
    else:
        mean, var = buffers["mean"], buffers["var"]
    h = jax.nn.relu((h - mean) / jnp.sqrt(var + 1e-5))
    return h @ params["w2"], buffers


def _bn_run(micro_batch_size, chunks):
    backend = _backend(micro_batch_size)
    rng = np.random.default_rng(0)
    params = {"w1": rng.normal(size=(8, 16)).astype(np.float32) / 3,
              "w2": rng.normal(size=(16, 4)).astype(np.float32) / 4}
    buffers = {"mean": np.zeros(16, np.float32), "var": np.ones(16, np.float32)}
    model = cstorch.compile(cstorch.FunctionalModel(_bn_apply, params, buffers), backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x, y):
        logits = jnp.concatenate([model(part) for part in jnp.split(x, chunks)])
        loss = xent(logits, y)
        cstorch.backward(loss)
        optimizer.step()
        return loss

    losses = [float(step(x, y)) for x, y in batches(5)]
    return np.array(losses), model.state_dict()


def test_batchnorm_normalizes_per_micro_batch_in_order():
    reference, ref_state = _bn_run(None, chunks=4)  # one device, four calls in a row
    losses, state = _bn_run(8, chunks=1)  # one call, four micro-batches of 8
    whole, _ = _bn_run(None, chunks=1)
    assert rel_err(losses, reference) <= 1e-6, (losses, reference)
    for name in ("mean", "var", "w1", "w2"):
        assert rel_err(state[name], ref_state[name]) <= 1e-6, name
    assert rel_err(losses, whole) > 1e-4  # not the statistics of the whole batch


def test_a_batch_the_micro_batch_does_not_divide_is_a_config_error():
    backend = _backend(12)
    model = cstorch.compile(cstorch.FunctionalModel(mlp_apply, mlp_params(0)), backend)
    step = xent_step(model, cstorch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(cstorch.ConfigError) as info:
        step(*batches(1)[0])
    message = str(info.value)
    assert "micro_batch_size=12" in message and "32 rows" in message and "Fix" in message


def test_an_output_without_a_batch_dimension_is_a_config_error():
    backend = _backend(8)
    model = cstorch.compile(
        cstorch.FunctionalModel(lambda p, x: (mlp_apply(p, x) ** 2).mean(), mlp_params(0)),
        backend)

    @cstorch.trace
    def step(x):
        return model(x)

    with pytest.raises(cstorch.ConfigError, match="every output needs the batch"):
        step(batches(1)[0][0])
