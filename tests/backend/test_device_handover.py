"""``with backend.device:`` hands a torch model's weights to ``compile`` without a second
copy, and a model built on torch's meta device is initialized by ``compile``.

References: torch itself (the same model built eagerly with the same seed, trained
with torch.optim), and torch's own storage bookkeeping (a storage whose weak handle
has expired is freed).
"""

from __future__ import annotations

import gc

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import cerebrax as cstorch
from cerebrax.backend import hand_over, is_handed_over


class Net(torch.nn.Module):
    def __init__(self, vocab=16, width=8):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, width)
        self.attn = torch.nn.MultiheadAttention(width, 2, batch_first=True)
        self.ln = torch.nn.LayerNorm(width)
        self.bn = torch.nn.BatchNorm1d(width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, x):
        h = self.emb(x)
        h = h + self.attn(h, h, h, need_weights=False)[0]
        h = self.ln(h)
        h = self.bn(h.transpose(1, 2)).transpose(1, 2)
        return self.head(h)


def _storages(module):
    """Weak handles of the storages of ``module``'s tensors (freed when expired)."""
    return {name: t.untyped_storage()._weak_ref()
            for name, t in [*module.named_parameters(), *module.named_buffers()]}


def _expired(handles):
    gc.collect()
    return {name: torch.UntypedStorage._expired(h) for name, h in handles.items()}


def _fresh():
    cstorch.reset()
    cstorch.amp.set_half_dtype("float32")
    return cstorch.backend("CPU")


@pytest.mark.parametrize("under_device", [True, False])
def test_weights_are_held_once_after_compile(under_device):
    backend = _fresh()
    torch.manual_seed(0)
    if under_device:
        with backend.device:
            net = Net()
    else:
        net = Net()
    want = {k: v.clone() for k, v in net.state_dict().items()}
    handles = _storages(net)
    compiled = cstorch.compile(net, backend)
    # The compiled state holds the values the module was built with ...
    got = compiled.state_dict()
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value.numpy(), err_msg=name)
    # ... and under the context the module's own storage is gone: one copy in all.
    expired = _expired(handles)
    assert all(expired.values()) == under_device, expired
    assert all(p.is_meta for p in net.parameters()) == under_device
    if under_device:
        shapes = {n: tuple(p.shape) for n, p in net.named_parameters()}
        assert shapes == {n: tuple(v.shape) for n, v in want.items() if n in shapes}
        assert all(
            not isinstance(v, jnp.ndarray)
            for v in compiled._adapter.converted.params.values())  # no pinned view


def test_each_tensor_is_freed_as_soon_as_it_is_copied():
    """The hand-over never holds two copies of more than one tensor at a time."""
    backend = _fresh()
    with backend.device:
        net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    handles = _storages(net)
    arrays = {n: jnp.asarray(t.detach().numpy()) for n, t in net.named_parameters()}
    slots, freed_when_taken = {}, []
    for name, value in hand_over(net, arrays).items():
        freed_when_taken.append(sum(_expired(handles).values()))
        slots[name] = jnp.array(value, copy=True)  # what a state slot does
    assert freed_when_taken == [0, 1, 2, 3]  # the previous tensor was freed each time
    assert all(_expired(handles).values())


def _train(net, batches, compiled=None):
    """Trains with loss.backward(), clip_grad_norm_ and SGD: torch code in the step."""
    loss_fn = torch.nn.CrossEntropyLoss()
    if compiled is None:
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)

        def step(x, y):
            optimizer.zero_grad()
            loss = loss_fn(net(x).reshape(-1, 16), y.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
            optimizer.step()
            return loss.detach()
    else:
        optimizer = cstorch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)

        @cstorch.trace
        def step(x, y):
            optimizer.zero_grad()
            loss = loss_fn(compiled(x).reshape(-1, 16), y.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
            optimizer.step()
            return loss
    return [float(step(x, y)) for x, y in batches]


def _batches(n=4):
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 16, (4, 5), generator=g), torch.randint(0, 16, (4, 5), generator=g))
            for _ in range(n)]


def test_a_handed_over_model_trains_like_torch():
    backend = _fresh()
    torch.manual_seed(0)
    with backend.device:
        net = Net()
    torch.manual_seed(0)
    reference = Net()
    compiled = cstorch.compile(net, backend)
    ours = _train(net, _batches(), compiled)
    theirs = _train(reference, _batches())
    np.testing.assert_allclose(ours, theirs, rtol=2e-5)
    state = net.state_dict()  # the module reads the compiled state
    for name, value in reference.state_dict().items():
        np.testing.assert_allclose(np.asarray(state[name]), value.numpy(), rtol=2e-4,
                                   atol=2e-6, err_msg=name)


def test_load_state_dict_into_a_handed_over_module():
    backend = _fresh()
    with backend.device:
        net = torch.nn.Linear(3, 2)
    compiled = cstorch.compile(net, backend)
    source = torch.nn.Linear(3, 2)
    result = net.load_state_dict(source.state_dict())  # no torch warning (an error here)
    assert not result.missing_keys and not result.unexpected_keys
    np.testing.assert_array_equal(compiled.state_dict()["weight"], source.weight.detach().numpy())
    with pytest.raises(RuntimeError, match="size mismatch"):
        net.load_state_dict(torch.nn.Linear(4, 2).state_dict())  # torch still checks


def test_a_meta_model_is_initialized_like_an_eager_build():
    backend = _fresh()
    torch.manual_seed(3)
    with torch.device("meta"):
        net = Net()
    assert all(p.is_meta for p in net.parameters())
    compiled = cstorch.compile(net, backend)
    torch.manual_seed(3)
    eager = Net()
    got = compiled.state_dict()
    for name, value in eager.state_dict().items():
        np.testing.assert_array_equal(got[name], value.numpy(), err_msg=name)
    assert all(p.is_meta for p in net.parameters())  # the values live in JAX only
    torch.manual_seed(3)
    np.testing.assert_allclose(_train(net, _batches(2), compiled),
                               _train(Net(), _batches(2)), rtol=2e-5)


class _Scaled(torch.nn.Module):
    """A parameter initialized in ``__init__`` only: nothing can replay it from meta."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 2)
        self.scale = torch.nn.Parameter(torch.full((2,), 0.5))
        self.register_buffer("mask", torch.tril(torch.ones(2, 2)))

    def forward(self, x):
        return self.fc(x) * self.scale @ self.mask


def test_a_meta_tensor_without_reset_parameters_is_refused_by_name():
    backend = _fresh()
    with torch.device("meta"):
        net = _Scaled()
    with pytest.raises(cstorch.ConfigError, match=r"(?s)_Scaled.*'scale', 'mask'.*backend\.device"):
        cstorch.compile(net, backend)


def test_a_model_built_under_the_device_with_custom_init_keeps_it():
    """Unlike a meta build, the device context runs the constructor's own init."""
    backend = _fresh()
    with backend.device:
        net = _Scaled()
    compiled = cstorch.compile(net, backend)
    np.testing.assert_array_equal(compiled.state_dict()["scale"], [0.5, 0.5])
    np.testing.assert_array_equal(compiled.state_dict()["mask"], np.tril(np.ones((2, 2))))
    x = np.ones((1, 2), np.float32)
    w, b = compiled.state_dict()["fc.weight"], compiled.state_dict()["fc.bias"]
    np.testing.assert_allclose(np.asarray(compiled(x)),
                               ((x @ w.T + b) * 0.5) @ np.tril(np.ones((2, 2))), rtol=1e-6)


def test_the_device_context_only_marks_what_is_built_inside():
    backend = _fresh()
    outside = torch.nn.Linear(2, 2)
    with backend.device:
        inside = torch.nn.Linear(2, 2)
        with backend.device:  # nesting is allowed
            nested = torch.nn.Linear(2, 2)
    after = torch.nn.Linear(2, 2)
    assert [is_handed_over(m.weight) for m in (outside, inside, nested, after)] == [
        False, True, True, False]


class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, x):
        return self.head(self.wte(x))


def test_a_tied_weight_is_handed_over_once():
    backend = _fresh()
    with backend.device:
        net = _Tied()
    want = net.wte.weight.detach().clone()
    handles = _storages(net)
    compiled = cstorch.compile(net, backend)
    assert all(_expired(handles).values())
    assert net.head.weight is net.wte.weight and net.wte.weight.is_meta
    state = net.state_dict()
    assert list(state) == ["wte.weight", "head.weight"]
    for name in state:
        np.testing.assert_array_equal(np.asarray(state[name]), want.numpy())
    x = np.array([[1, 2, 3]])
    np.testing.assert_allclose(np.asarray(compiled(x)),
                               want.numpy()[x] @ want.numpy().T, rtol=1e-6)
