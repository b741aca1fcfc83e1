"""A torch module through cstorch.compile, used the way a ported torch script uses it.

The original module stays the handle: its parameters go to cstorch optimizers (param
groups and frozen parameters included), its ``state_dict()`` / ``load_state_dict()`` read
and write the compiled state, its ``train()`` / ``eval()`` switch the compiled mode, and
torch batches reach the traced step without a copy where possible. The anchor is training
parity with torch itself: 50 AdamW steps give the same losses.
"""

from __future__ import annotations

import copy
import pickle
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn as nn
from bridge_zoo import rel_err, seeded

import cerebrax as cstorch
import torch_bridge
from cerebrax._step import to_torch, torch_to_jax
from helpers import CSTORCH_ADAMW


class _MLP(nn.Module):
    """An MLP with LayerNorm, GELU and a BatchNorm (a buffer updated in train mode)."""

    def __init__(self, d_in=12, hidden=32, classes=5):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, hidden, bias=False)  # followed by BatchNorm
        self.bn = nn.BatchNorm1d(hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        h = nn.functional.gelu(self.norm(self.fc1(x)))
        h = torch.relu(self.bn(self.fc2(h)))
        return self.head(h)


class _TiedLM(nn.Module):
    """A tiny language model whose output head shares the embedding matrix."""

    def __init__(self, vocab=17, d=8):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.norm = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        self.register_buffer("scale", torch.tensor(2.0), persistent=False)

    def forward(self, tokens):
        return self.lm_head(self.norm(self.wte(tokens)) * self.scale)


def _batches(n, *, batch=16, d_in=12, classes=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n * batch, d_in, generator=gen)
    teacher = torch.randn(d_in, classes, generator=torch.Generator().manual_seed(123))
    y = (x @ teacher).argmax(1)  # learnable labels, so that the loss falls
    dataset = torch.utils.data.TensorDataset(x, y)
    return torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=False)


def _training_step(compiled, optimizer):
    loss_fn = torch_bridge.convert(nn.CrossEntropyLoss())

    @cstorch.trace
    def training_step(inputs, targets):
        loss = loss_fn(compiled(inputs), targets)
        cstorch.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return training_step


def _torch_losses(module, optimizer, loader):
    losses = []
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(module(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


# ---- training parity ---------------------------------------------------------------


def test_50_adamw_steps_give_the_same_losses_as_torch():
    module = seeded(_MLP)
    reference = copy.deepcopy(module)
    loader = _batches(50)
    hparams = dict(lr=3e-3, betas=(0.9, 0.98), eps=1e-7, weight_decay=0.05)

    compiled = cstorch.compile(module, "CPU")
    optimizer = cstorch.optim.AdamW(module.parameters(), **hparams)
    training_step = _training_step(compiled, optimizer)
    losses = [float(training_step(x, y)) for x, y in loader]  # torch batches, as they come

    expected = _torch_losses(reference, torch.optim.AdamW(reference.parameters(), **hparams),
                             loader)
    assert len(losses) == 50
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, expected))
    assert worst <= 1e-4, (worst, losses[:3], expected[:3])
    assert expected[-1] < 0.8 * expected[0]  # it trained, so the comparison means something
    # The weights and BatchNorm statistics agree too, read through the original module.
    state = module.state_dict()
    for name, value in reference.state_dict().items():
        assert state[name].dtype == value.dtype, name
        assert rel_err(state[name], value) <= 1e-4, name


def test_param_groups_and_frozen_parameters_of_the_original_module():
    module = seeded(_MLP)
    module.fc1.bias.requires_grad_(False)  # frozen before compile
    reference = copy.deepcopy(module)
    compiled = cstorch.compile(module, "CPU")
    module.norm.weight.requires_grad_(False)  # frozen after compile, before the optimizer
    reference.norm.weight.requires_grad_(False)

    def groups(m):
        return [
            {"params": [m.fc1.weight, m.fc2.weight, m.head.weight], "lr": 5e-3},
            {"params": [p for n, p in m.named_parameters() if not n.endswith(".weight")]
             + [m.norm.weight, m.bn.weight], "weight_decay": 0.0},
        ]

    optimizer = cstorch.optim.AdamW(groups(module), lr=1e-3, weight_decay=0.1)
    assert [len(g["params"]) for g in optimizer.param_groups] == [3, 6]
    assert optimizer.param_groups[0]["params"][0].name == "fc1.weight"
    assert optimizer.param_groups[0]["lr"] == pytest.approx(5e-3)
    assert optimizer.param_groups[1]["weight_decay"] == 0.0

    loader = _batches(6, seed=1)
    training_step = _training_step(compiled, optimizer)
    losses = [float(training_step(x, y)) for x, y in loader]
    torch_optimizer = torch.optim.AdamW(groups(reference), lr=1e-3, weight_decay=0.1,
                                        eps=1e-6)  # cstorch's default eps
    expected = _torch_losses(reference, torch_optimizer, loader)
    assert max(abs(a - b) / abs(b) for a, b in zip(losses, expected)) <= 1e-4

    state = module.state_dict()
    initial = seeded(_MLP).state_dict()
    for frozen in ("fc1.bias", "norm.weight"):
        assert torch.equal(state[frozen], initial[frozen]), frozen
    assert not torch.equal(state["fc1.weight"], initial["fc1.weight"])
    for name, value in reference.state_dict().items():
        assert rel_err(state[name], value) <= 1e-4, name


def test_tied_weights_optimizer_and_parity():
    module = seeded(_TiedLM)
    reference = copy.deepcopy(module)
    compiled = cstorch.compile(module, "CPU")
    optimizer = cstorch.optim.AdamW(module.parameters(), lr=1e-2)
    assert len(optimizer.param_groups[0]["params"]) == len(list(module.parameters())) == 3
    loss_fn = torch_bridge.convert(nn.CrossEntropyLoss())

    @cstorch.trace
    def training_step(tokens, targets):
        logits = compiled(tokens)
        loss = loss_fn(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        cstorch.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        return loss

    torch_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2,
                                        **CSTORCH_ADAMW)
    gen = torch.Generator().manual_seed(3)
    for _ in range(5):
        tokens = torch.randint(0, 17, (4, 6), generator=gen)
        targets = torch.roll(tokens, -1, dims=1)
        loss = float(training_step(tokens, targets))
        torch_optimizer.zero_grad()
        expected = nn.functional.cross_entropy(reference(tokens).reshape(-1, 17),
                                               targets.reshape(-1))
        expected.backward()
        torch_optimizer.step()
        assert rel_err(loss, expected.item()) <= 1e-5
    state = module.state_dict()
    assert state["lm_head.weight"] is state["wte.weight"]
    assert rel_err(state["wte.weight"], reference.wte.weight.detach()) <= 1e-4


# ---- state dicts --------------------------------------------------------------------


def test_tied_weight_state_dict_round_trip():
    module = seeded(_TiedLM)
    compiled = cstorch.compile(module, "CPU")
    names = [n for n, _ in compiled.named_parameters()]
    assert "lm_head.weight" not in names  # stored once

    state = compiled.state_dict()
    torch_state = seeded(_TiedLM).state_dict()
    assert list(state) == list(torch_state)  # both names, torch's order, no "scale"
    assert state["lm_head.weight"] is state["wte.weight"]

    other = seeded(_TiedLM, seed=7).state_dict()
    result = compiled.load_state_dict(other)  # strict, a torch state dict with both names
    assert result.missing_keys == [] and result.unexpected_keys == []
    np.testing.assert_array_equal(compiled.state_dict()["lm_head.weight"], other["wte.weight"])

    # Either name alone loads the tied weight; it is missing only when both are.
    only_alias = {k: v for k, v in state.items() if k != "wte.weight"}
    compiled.load_state_dict(only_alias)
    np.testing.assert_array_equal(compiled.state_dict()["wte.weight"], state["wte.weight"])
    neither = {k: v for k, v in state.items() if k not in ("wte.weight", "lm_head.weight")}
    with pytest.raises(cstorch.errors.StateError, match="missing keys"):
        compiled.load_state_dict(neither)
    result = compiled.load_state_dict(neither, strict=False)
    assert result.missing_keys == ["wte.weight", "lm_head.weight"]

    # Through a checkpoint file and back, into the compiled model and a fresh torch one.
    cstorch.save({"model": compiled.state_dict()}, "tied.mdl")
    loaded = cstorch.load("tied.mdl")["model"]
    fresh = seeded(_TiedLM, seed=5)
    fresh.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in loaded.items()})
    tokens = torch.randint(0, 17, (2, 5), generator=torch.Generator().manual_seed(0))
    np.testing.assert_allclose(np.asarray(compiled(tokens)), fresh(tokens).detach().numpy(),
                               rtol=1e-5, atol=1e-6)


def test_the_original_module_reads_and_writes_the_compiled_state():
    module = seeded(_MLP)
    initial = copy.deepcopy(module)
    compiled = cstorch.compile(module, "CPU")
    optimizer = cstorch.optim.AdamW(module.parameters(), lr=1e-2)
    training_step = _training_step(compiled, optimizer)
    for x, y in _batches(3):
        training_step(x, y)

    # Reads: torch tensors (host copies) of the compiled values, in the module's dtypes.
    state = module.state_dict()
    compiled_state = compiled.state_dict()
    assert list(state) == list(initial.state_dict())
    for name, value in state.items():
        assert isinstance(value, torch.Tensor) and not value.requires_grad, name
        np.testing.assert_array_equal(value.numpy(), compiled_state[name])
    assert state["bn.num_batches_tracked"].dtype == torch.int64
    assert int(state["bn.num_batches_tracked"]) == 3
    assert not torch.equal(state["fc1.weight"], initial.fc1.weight)
    state["fc1.weight"].zero_()  # a copy: writing it changes nothing compiled
    assert np.abs(compiled.state_dict()["fc1.weight"]).sum() > 0
    # keep_vars=True still gives the module's own parameters (torch.export relies on it).
    assert module.state_dict(keep_vars=True)["fc1.weight"] is module.fc1.weight
    # A parent module sees the compiled values under its prefix.
    parent = nn.ModuleDict({"net": module})
    np.testing.assert_array_equal(parent.state_dict()["net.fc2.weight"].numpy(),
                                  compiled_state["fc2.weight"])

    # Writes: values of any array kind, cast to the compiled dtype; the caller's dict is
    # left as it was.
    target = seeded(_MLP, seed=9).state_dict()
    mixed = {k: v.double() if v.is_floating_point() else v for k, v in target.items()}
    mixed["fc1.weight"] = target["fc1.weight"].numpy()
    mixed["head.bias"] = jnp.asarray(target["head.bias"].numpy())
    before = dict(mixed)
    result = module.load_state_dict(mixed)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert all(mixed[k] is before[k] for k in before)
    after = compiled.state_dict()
    for name, value in target.items():
        np.testing.assert_allclose(after[name], value.numpy(), rtol=1e-6, err_msg=name)
        assert after[name].dtype == compiled_state[name].dtype, name

    # Errors are torch's own; a mismatched entry leaves the compiled value alone.
    bad = dict(target)
    bad["head.weight"] = torch.zeros(3, 3)
    with pytest.raises(RuntimeError, match="size mismatch for head.weight"):
        module.load_state_dict(bad)
    assert compiled.state_dict()["head.weight"].shape == (5, 32)
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "fc1.bias"'):
        module.load_state_dict({k: v for k, v in target.items() if k != "fc1.bias"})

    # A checkpoint of lazy arrays loads through the original module.
    cstorch.save({"model": module.state_dict()}, "ckpt.mdl")
    module.load_state_dict(initial.state_dict())
    module.load_state_dict(cstorch.load("ckpt.mdl")["model"])
    np.testing.assert_array_equal(compiled.state_dict()["fc1.weight"], after["fc1.weight"])

    # A copy of the module (deepcopy, pickle) is plain torch again: its state is its own.
    for clone in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        clone.load_state_dict(initial.state_dict())
        np.testing.assert_array_equal(compiled.state_dict()["fc1.weight"], after["fc1.weight"])
        assert torch.equal(clone.state_dict()["fc1.weight"], initial.fc1.weight)


def test_hooks_follow_the_latest_compile_and_stop_after_reset():
    module = seeded(_MLP)
    first = cstorch.compile(module, "CPU")
    second = cstorch.compile(module, "CPU")
    second.load_state_dict(seeded(_MLP, seed=4).state_dict())
    assert not np.array_equal(first.state_dict()["fc1.weight"], second.state_dict()["fc1.weight"])
    np.testing.assert_array_equal(module.state_dict()["fc1.weight"].numpy(),
                                  second.state_dict()["fc1.weight"])
    cstorch.reset()
    # The compiled state is gone with the backend: the module is plain torch again.
    assert torch.equal(module.state_dict()["fc1.weight"], module.fc1.weight.detach())


# ---- modes --------------------------------------------------------------------------


def test_train_and_eval_on_the_original_module_switch_the_compiled_mode():
    module = seeded(_MLP)
    reference = copy.deepcopy(module)
    compiled = cstorch.compile(module, "CPU")
    assert compiled.training
    optimizer = cstorch.optim.SGD(module.parameters(), lr=0.1)
    training_step = _training_step(compiled, optimizer)
    x, y = next(iter(_batches(1)))
    training_step(x, y)

    module.eval()
    assert not compiled.training
    with pytest.raises(cstorch.RecompileError, match="compiled with the model in train mode"):
        training_step(x, y)

    @cstorch.trace
    def eval_step(inputs):
        return compiled(inputs)

    # Eval mode uses the running statistics that the train step updated, as torch does.
    torch_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    nn.functional.cross_entropy(reference(x), y).backward()
    torch_optimizer.step()
    reference.eval()
    np.testing.assert_allclose(np.asarray(eval_step(x)), reference(x).detach().numpy(),
                               rtol=1e-5, atol=1e-5)

    module.train()
    assert compiled.training
    training_step(x, y)  # the train-mode step runs again
    compiled.eval()  # and the compiled model's own switch reaches the module
    assert not module.training and not module.bn.training
    with pytest.raises(cstorch.RecompileError):
        training_step(x, y)


# ---- torch batches ------------------------------------------------------------------


def _shares_memory(array: jax.Array, tensor: torch.Tensor) -> bool:
    return array.unsafe_buffer_pointer() == tensor.data_ptr()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32,
                                   torch.uint8, torch.bool])
def test_torch_tensors_become_jax_arrays_without_a_copy(dtype):
    t = (torch.randn(32, 16) * 10).to(dtype)
    x = torch_to_jax(t)
    assert x.dtype == np.dtype(ml_dtypes.bfloat16 if dtype == torch.bfloat16
                               else str(dtype).removeprefix("torch."))
    assert _shares_memory(x, t)  # DLPack: the same buffer
    np.testing.assert_array_equal(np.asarray(x).astype(np.float32), t.float().numpy())
    del t  # the array keeps the torch storage alive
    assert np.asarray(x).shape == (32, 16)


def test_torch_tensors_that_cannot_be_shared_are_copied_correctly():
    base = torch.randn(6, 5, requires_grad=True)
    for t in (base, base.detach().t(), base.detach()[:, 1], torch.arange(12).reshape(3, 4),
              torch.randn(4, dtype=torch.float64)):
        x = torch_to_jax(t)
        expected = t.detach().numpy()
        assert x.shape == expected.shape
        np.testing.assert_array_equal(np.asarray(x), expected.astype(x.dtype))
    assert torch_to_jax(torch.arange(3)).dtype == jnp.int32  # as jnp.asarray, without x64
    assert to_torch(np.ones(2, ml_dtypes.bfloat16)).dtype == torch.bfloat16


def test_traced_steps_never_donate_shared_inputs():
    module = seeded(_MLP)
    compiled = cstorch.compile(module, "CPU")
    optimizer = cstorch.optim.SGD(module.parameters(), lr=0.1)
    training_step = _training_step(compiled, optimizer)
    x, y = next(iter(_batches(1)))
    x_before = x.clone()
    shared = torch_to_jax(x)
    assert _shares_memory(shared, x)
    for _ in range(3):
        training_step(shared, y)
        training_step(x, y)  # the torch tensor itself, shared on the way in
    assert not shared.is_deleted()
    assert torch.equal(x, x_before)  # XLA never wrote into the torch memory
    np.testing.assert_array_equal(np.asarray(shared), x_before.numpy())
    # The program donates the state, and the state only: its last two arguments (the
    # batch) carry no donation attribute.
    text = training_step.lower(x, y).as_text()
    signature = text[text.index("func.func public @main("):]
    signature = signature[:signature.index(") -> (")]
    arguments = re.findall(r"%arg\d+: [^%]*", signature)
    donated = ["tf.aliasing_output" in a or "jax.buffer_donor" in a for a in arguments]
    assert donated[-2:] == [False, False] and all(donated[:-2]), arguments


def test_cstorch_dataloader_over_a_torch_dataloader_shares_the_batches():
    keep = [(torch.randn(8, 12), torch.randn(8, 4).to(torch.bfloat16), torch.arange(8))
            for _ in range(3)]

    def input_fn():
        return torch.utils.data.DataLoader(keep, batch_size=None)  # batches as they are

    loader = cstorch.utils.data.DataLoader(input_fn, num_steps=3)
    executor = cstorch.utils.data.DataExecutor(loader, progress_bar=False)
    for i, (x, xb, y) in enumerate(executor):
        t, tb, ty = keep[i]
        assert (x.dtype, xb.dtype, y.dtype) == (jnp.float32, jnp.bfloat16, jnp.int32)
        assert _shares_memory(x, t) and _shares_memory(xb, tb)
        np.testing.assert_array_equal(np.asarray(xb), tb.view(torch.int16).numpy().view(
            ml_dtypes.bfloat16))
        np.testing.assert_array_equal(np.asarray(y), ty.numpy())


def test_bfloat16_batches_reach_a_bfloat16_step():
    seen = []

    @cstorch.trace
    def step(x):
        seen.append(x.dtype)
        return (x.astype(jnp.float32) * 2).sum()

    t = torch.randn(4, 8).to(torch.bfloat16)
    out = step(t)
    assert seen == [jnp.bfloat16]
    assert float(out) == pytest.approx(float(t.float().sum() * 2), rel=1e-6)
