"""convert(): state naming, tied weights, buffers, random ops, losses, errors, caching."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from bridge_zoo import GPT, MLP, rel_err, seeded

import torch_bridge
from cerebrax.errors import ConfigError, UnsupportedOpError
from torch_bridge.ops import _registry


@pytest.fixture
def registry_snapshot():
    saved = dict(_registry._LOWERINGS)
    yield
    _registry._LOWERINGS.clear()
    _registry._LOWERINGS.update(saved)


def test_params_keep_state_dict_names_and_tied_weights_are_stored_once():
    model = seeded(GPT)
    conv = torch_bridge.convert(model)
    assert "lm_head.weight" not in conv.params
    assert conv.aliases["lm_head.weight"] == "wte.weight"
    names = [n for n, _ in model.named_parameters()]  # torch's own de-duplicated list
    assert list(conv.params) == names
    np.testing.assert_array_equal(conv.params["wte.weight"], model.wte.weight.detach().numpy())

    # The tied array is the one both uses read: zeroing it zeroes the logits.
    idx = jnp.zeros((1, 4), jnp.int32)
    params = dict(conv.params, **{"wte.weight": jnp.zeros_like(conv.params["wte.weight"])})
    logits, _ = conv.apply(params, conv.buffers, idx)
    assert float(jnp.abs(logits).max()) == 0.0


class _BN(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(3, momentum=0.3)

    def forward(self, x):
        return self.bn(x)


def test_batchnorm_running_statistics_follow_torch_over_steps():
    model = seeded(_BN)
    conv = torch_bridge.convert(model, train=True)
    reference = seeded(_BN).train()
    buffers = conv.buffers
    assert buffers["bn.num_batches_tracked"].dtype == jnp.int32  # int64 without x64
    step = jax.jit(lambda p, b, x: conv.apply(p, b, x))
    for i in range(3):
        x = torch.randn(5, 3, generator=torch.Generator().manual_seed(i)) * (i + 1)
        out, buffers = step(conv.params, buffers, jnp.asarray(x.numpy()))
        np.testing.assert_allclose(out, reference(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    for name, value in reference.named_buffers():
        np.testing.assert_allclose(buffers[name], value.numpy(), rtol=1e-6)
    assert int(buffers["bn.num_batches_tracked"]) == 3

    evaluated = torch_bridge.convert(model, train=False)
    x = torch.randn(4, 3)
    out, same = evaluated.apply(conv.params, buffers, jnp.asarray(x.numpy()))
    np.testing.assert_allclose(out, reference.eval()(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    assert same["bn.running_mean"] is buffers["bn.running_mean"]


def test_dropout_is_identity_in_eval_and_keyed_in_train():
    model = nn.Sequential(nn.Dropout(0.5))
    x = jnp.ones((200, 50))
    out, _ = torch_bridge.convert(model).apply({}, {}, x)
    np.testing.assert_array_equal(out, x)

    train = torch_bridge.convert(model, train=True)
    a, _ = train.apply({}, {}, x, key=jax.random.key(0))
    b, _ = train.apply({}, {}, x, key=jax.random.key(0))
    c, _ = train.apply({}, {}, x, key=jax.random.key(1))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert set(np.unique(np.asarray(a))) == {0.0, 2.0}  # kept values scaled by 1/(1-p)
    assert abs(float(jnp.mean(a == 0)) - 0.5) < 0.02
    with pytest.raises(ConfigError, match="needs a PRNG key"):
        train.apply({}, {}, x)


class _Noisy(nn.Module):
    def forward(self, x):
        return x + torch.rand_like(x), x + torch.rand_like(x), torch.randn(3, 4)


def test_each_random_op_gets_its_own_key():
    conv = torch_bridge.convert(_Noisy(), train=True)
    (a, b, n), _ = conv.apply({}, {}, jnp.zeros((64,)), key=jax.random.key(3))
    assert conv.programs[0].needs_key and len(conv.programs[0].random_nodes) == 3
    assert not np.array_equal(a, b)
    assert 0.0 <= float(a.min()) and float(a.max()) < 1.0 and n.shape == (3, 4)


@pytest.mark.parametrize("kwargs", [{}, {"label_smoothing": 0.1, "ignore_index": 2}])
def test_cross_entropy_loss_converts_and_runs_on_jax_arrays(kwargs):
    loss_fn = torch_bridge.convert(nn.CrossEntropyLoss(**kwargs))
    assert loss_fn.params == {} and loss_fn.buffers == {}
    logits = torch.randn(6, 5, generator=torch.Generator().manual_seed(0), requires_grad=True)
    labels = torch.tensor([0, 2, 4, 1, 2, 3])
    expected = nn.CrossEntropyLoss(**kwargs)(logits, labels)
    expected.backward()

    jlogits, jlabels = jnp.asarray(logits.detach().numpy()), jnp.asarray(labels.numpy())
    loss = loss_fn(jlogits, jlabels)
    assert loss.shape == () and rel_err(loss, expected.item()) < 1e-6
    grad = jax.grad(lambda z: loss_fn.apply({}, {}, z, jlabels)[0])(jlogits)
    assert rel_err(grad, logits.grad.numpy()) < 1e-5


class _Twice(nn.Module):
    def forward(self, x):
        return torch.ops.bridgetest.twice(x) + 1


class _Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Twice()

    def forward(self, x):
        return self.inner(x)


@torch.library.custom_op("bridgetest::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return 2 * x


@_twice.register_fake
def _twice_fake(x):
    return torch.empty_like(x)


def test_unsupported_op_names_op_module_path_and_fix(registry_snapshot):
    conv = torch_bridge.convert(_Outer())
    with pytest.raises(UnsupportedOpError) as info:
        conv(jnp.ones(3))
    message = str(info.value)
    assert "bridgetest.twice.default" in message
    assert "'inner'" in message and "_Twice" in message
    assert "@lowering(torch.ops.bridgetest.twice.default)" in message

    @torch_bridge.lowering(torch.ops.bridgetest.twice.default)
    def twice(x):
        return 2 * x

    np.testing.assert_array_equal(torch_bridge.convert(_Outer())(jnp.ones(3)), 3.0)


def test_lowering_rejects_a_packet():
    with pytest.raises(TypeError, match="overload"):
        torch_bridge.lowering(torch.ops.aten.relu)


def test_lowering_rejects_an_op_name_without_its_overload():
    with pytest.raises(TypeError, match="'namespace.op.overload', got 'transformers.gmm'"):
        torch_bridge.lowering("transformers.gmm")


def test_grouped_mm_of_unsupported_operands_names_the_supported_ones():
    from torch_bridge.ops.linalg import grouped_mm

    with pytest.raises(NotImplementedError, match="3-d x 3-d operands and for 2-d rows"):
        grouped_mm(jnp.zeros((2, 3)), jnp.zeros((3, 4)))


def test_one_export_per_mode_and_input_signature():
    model = seeded(MLP)
    conv = torch_bridge.convert(model, example_inputs=torch.zeros(2, 16))
    assert len(conv.programs) == 1
    conv(jnp.zeros((2, 16)))
    conv(jnp.ones((2, 16)))
    assert len(conv.programs) == 1
    conv(jnp.zeros((3, 16)))
    conv.run(conv.params, conv.buffers, (jnp.zeros((3, 16)),), {}, train=True)
    assert len(conv.programs) == 3


class _Kw(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, *, scale=2.0, extra=None):
        y = self.fc(x) * scale
        return {"y": y, "parts": (y + extra, torch.argmax(y, dim=-1))}


def test_keyword_inputs_and_nested_outputs():
    model = seeded(_Kw)
    conv = torch_bridge.convert(model)
    x, extra = torch.randn(3, 4), torch.randn(3, 4)
    expected = model(x, scale=3.0, extra=extra)
    out = conv(jnp.asarray(x.numpy()), scale=3.0, extra=jnp.asarray(extra.numpy()))
    assert set(out) == {"y", "parts"}
    np.testing.assert_allclose(out["parts"][0], expected["parts"][0].detach().numpy(),
                               rtol=1e-6)
    np.testing.assert_array_equal(out["parts"][1], expected["parts"][1].numpy())
    assert out["parts"][1].dtype == jnp.int32


def test_layer_norm_without_affine_gradients_match_torch():
    x = torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(0), requires_grad=True)
    w = torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(1))
    (F.layer_norm(x, (6, 8)) * w).sum().backward()
    conv = torch_bridge.convert(nn.LayerNorm((6, 8), elementwise_affine=False))
    grad = jax.grad(lambda z: jnp.sum(conv.apply({}, {}, z)[0] * jnp.asarray(w.numpy())))(
        jnp.asarray(x.detach().numpy()))
    assert rel_err(grad, x.grad.numpy()) < 1e-5


def test_registry_covers_the_common_core_aten_ops():
    ops = torch_bridge.lowered_ops()
    assert len(ops) >= 120
    for op in ("aten.convolution.default", "aten.native_layer_norm.default",
               "aten.lstm.input", "aten.scaled_dot_product_attention.default",
               "aten.max_pool2d_with_indices.default", "aten.native_dropout.default"):
        assert op in ops


class _Stops(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            scale = self.fc(x).mean()
        y = self.fc(x)
        return y.detach() * scale + y * y


def test_detach_and_no_grad_blocks_stop_gradients_as_in_torch():
    model = seeded(_Stops)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    model(x).sum().backward()
    conv = torch_bridge.convert(model)
    grads = jax.grad(lambda p: jnp.sum(conv.apply(p, {}, jnp.asarray(x.numpy()))[0]))(
        conv.params)
    for name, p in model.named_parameters():
        assert rel_err(grads[name], p.grad.numpy()) < 1e-5, name
