"""On a host with 8 emulated devices, the single-device backends stay on their device.

Run in its own process:
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest tests/multidevice
"""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from helpers import batches, compiled_mlp, mlp_apply, mlp_params, xent, xent_step

import cerebrax as cstorch


def test_eight_devices_are_visible():
    assert jax.device_count() == 8


@pytest.mark.parametrize("kind", ["CPU", "CSX"])
def test_training_step_runs_on_the_backend_device(kind):
    cstorch.amp.set_half_dtype("float32")
    backend = cstorch.backend(kind)
    assert backend.device == jax.devices()[0]
    model = compiled_mlp(backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    step = xent_step(model, optimizer)

    tx = cstorch.optim.transforms.sgd(0.1, momentum=0.9)
    params, state = mlp_params(), None
    state = tx.init(params)

    @jax.jit
    def reference(params, state, x, y):
        loss, grads = jax.value_and_grad(lambda p: xent(mlp_apply(p, x), y))(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    loader = cstorch.utils.data.DataLoader(lambda: batches(6), num_steps=6)
    for (x, y), (rx, ry) in zip(cstorch.utils.data.DataExecutor(loader, progress_bar=False),
                                batches(6)):
        assert x.devices() == {backend.device}
        loss = step(x, y)
        params, state, ref = reference(params, state, rx, ry)
        assert loss.devices() == {backend.device}
        np.testing.assert_allclose(loss, ref, rtol=1e-6)
    for p in model.parameters():
        assert p._value.devices() == {backend.device}


def test_cluster_config_for_a_wafer_validates_on_eight_devices():
    config = cstorch.distributed.ClusterConfig(num_csx=2, execution_mode="replica",
                                               num_replicas=4)
    backend = cstorch.backend("CSX", cluster_config=config)
    assert backend.cluster_config.num_csx * backend.cluster_config.num_replicas == 8
