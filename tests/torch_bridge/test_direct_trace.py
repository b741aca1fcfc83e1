"""A compiled torch model traced op by op (``torch_bridge._direct``) instead of exported.

Where the direct trace runs, training must equal the exported graph's and torch eager's;
where it could differ (random ops, kept-whole ops, custom Functions, hooks, half
precision, side calls), the call must be exported, and say why
(``Converted.direct_refusals``). Every case trains with both captures
(``CEREBRAX_TORCH_CAPTURE``) and with torch eager.
"""

from __future__ import annotations

import copy
import math
import os
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import cerebrax as cstorch
from cerebrax.errors import ConfigError, TensorReadError, UnsupportedOpError
from torch_bridge import JaxTensor

STEPS, LR = 4, 0.05


# ---- models -----------------------------------------------------------------------------
class Tabular(torch.nn.Module):
    """Embedding, LayerNorm, BatchNorm in train mode (running statistics), GELU, and an
    output projection tied to the embedding."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 12)
        self.ln = torch.nn.LayerNorm(12)
        self.fc = torch.nn.Linear(12, 12)
        self.bn = torch.nn.BatchNorm1d(12)
        self.out = torch.nn.Linear(12, 20, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, x):
        h = self.ln(self.emb(x)).mean(1)
        return self.out(torch.nn.functional.gelu(self.bn(self.fc(h))))


class CausalLM(torch.nn.Module):
    """A GPT-style block with hand-written causal attention over a registered mask."""

    def __init__(self, width=16, heads=2, seq=6, vocab=20):
        super().__init__()
        self.heads = heads
        self.wte = torch.nn.Embedding(vocab, width)
        self.wpe = torch.nn.Parameter(torch.randn(seq, width) * 0.1)
        self.ln = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, vocab)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool)),
                             persistent=False)

    def forward(self, x):
        b, t = x.shape
        h = self.wte(x) + self.wpe[:t]
        q, k, v = self.qkv(self.ln(h)).split(h.shape[-1], dim=-1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, -1)
        return self.head(h + self.proj(y)).mean(1)


class Conv(torch.nn.Module):
    """Conv2d, BatchNorm2d, max pooling and adaptive average pooling."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 20)

    def forward(self, x):
        h = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(torch.nn.functional.adaptive_avg_pool2d(h, 1).flatten(1))


class Dropout(Tabular):
    def __init__(self):
        super().__init__()
        self.drop = torch.nn.Dropout(0.2)

    def forward(self, x):
        return self.drop(super().forward(x))


class StochasticDepth(Tabular):
    """Draws its mask on a plain torch tensor, as torchvision's StochasticDepth does."""

    def forward(self, x):
        y = super().forward(x)
        keep = torch.empty(y.shape[0], 1).bernoulli_(0.8)
        return y * keep / 0.8


class Attention(CausalLM):
    """CausalLM with scaled_dot_product_attention, dropping ``dropout`` in train mode."""

    dropout = 0.0

    def forward(self, x):
        b, t = x.shape
        h = self.wte(x) + self.wpe[:t]
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2)
                   for z in self.qkv(self.ln(h)).split(h.shape[-1], dim=-1))
        y = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.head(h + self.proj(y.transpose(1, 2).reshape(b, t, -1))).mean(1)


class AttentionDropout(Attention):
    dropout = 0.1


class Recurrent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 8)
        self.lstm = torch.nn.LSTM(8, 8, batch_first=True)
        self.fc = torch.nn.Linear(8, 20)

    def forward(self, x):
        return self.fc(self.lstm(self.emb(x))[0][:, -1])


class Halve(torch.autograd.Function):
    """Identity forward, half the gradient: a backward that is not the forward's."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * 0.5


class CustomFunction(Tabular):
    def forward(self, x):
        return Halve.apply(super().forward(x))


class TensorHook(Tabular):
    def forward(self, x):
        y = super().forward(x)
        if y.requires_grad:
            y.register_hook(lambda g: g * 0.5)
        return y


def module_hooked():
    model = Tabular()
    model.fc.register_full_backward_hook(lambda m, gi, go: (gi[0] * 0.5,))
    return model


def half_model():
    return Tabular().to(torch.bfloat16)


DIRECT = {"tabular": Tabular, "causal_lm": CausalLM, "conv": Conv, "sdpa": Attention}
REFUSED = {
    "dropout": (Dropout, "random op"),
    "stochastic_depth": (StochasticDepth, "random op"),
    "sdpa_dropout": (AttentionDropout, "random op scaled_dot_product_attention"),
    "lstm": (Recurrent, "recurrent layer"),
    "custom_function": (CustomFunction, "custom autograd Function Halve"),
    "tensor_hook": (TensorHook, "gradient hook"),
    "module_hook": (module_hooked, "module backward hook"),
    "bfloat16": (half_model, "torch.bfloat16"),
}


def data(name: str, step: int):
    g = torch.Generator().manual_seed(100 + step)
    x = (torch.randn(4, 3, 8, 8, generator=g) if name == "conv"
         else torch.randint(0, 20, (4, 6), generator=g))
    return x, torch.randint(0, 20, (4,), generator=g)


# ---- training -----------------------------------------------------------------------------
def train_cerebrax(build, name: str, capture: str, monkeypatch):
    """Losses and final state dict of STEPS SGD steps with ``capture``, and the
    compiled model's Converted (which says how the calls were captured)."""
    monkeypatch.setenv("CEREBRAX_TORCH_CAPTURE", capture)
    cstorch.reset()
    torch.manual_seed(0)
    model = build().train()
    compiled = cstorch.compile(model, "CPU")
    optimizer = cstorch.optim.SGD(model.parameters(), lr=LR)
    loss_fn = torch.nn.CrossEntropyLoss()

    @cstorch.trace
    def step(x, y):
        loss = loss_fn(compiled(x).float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    losses = [float(step(*data(name, i)).detach()) for i in range(STEPS)]
    state = {k: v.detach().float().numpy().copy() for k, v in model.state_dict().items()}
    return losses, state, compiled._adapter.converted


def train_eager(build, name: str):
    torch.manual_seed(0)
    model = build().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    loss_fn = torch.nn.CrossEntropyLoss()
    losses = []
    for i in range(STEPS):
        x, y = data(name, i)
        loss = loss_fn(model(x).float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().float().numpy() for k, v in model.state_dict().items()}


def assert_states_close(a: dict, b: dict, rtol: float, atol: float) -> None:
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=rtol, atol=atol, err_msg=k)


@pytest.mark.parametrize("name", list(DIRECT))
def test_direct_trace_trains_as_the_export_and_torch_eager(name, monkeypatch):
    build = DIRECT[name]
    losses, state, converted = train_cerebrax(build, name, "auto", monkeypatch)
    assert converted.direct_refusals == {}
    assert converted.programs == []  # nothing exported
    ex_losses, ex_state, ex_converted = train_cerebrax(build, name, "export", monkeypatch)
    assert len(ex_converted.programs) == 1
    # The same float32 operations in the same order, lowered by the same registry: both
    # captures give one program, up to XLA's choices within an expression (one ulp).
    np.testing.assert_allclose(losses, ex_losses, rtol=1e-6)
    assert_states_close(state, ex_state, rtol=1e-5, atol=1e-6)
    # torch eager: oneDNN's and XLA's float32 sums and matmuls differ by a few ulps,
    # which STEPS updates carry forward.
    eager_losses, eager_state = train_eager(build, name)
    np.testing.assert_allclose(losses, eager_losses, rtol=2e-5)
    assert_states_close(state, eager_state, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list(REFUSED))
def test_constructs_the_direct_trace_would_run_differently_are_exported(name, monkeypatch):
    build, reason = REFUSED[name]
    losses, state, converted = train_cerebrax(build, name, "auto", monkeypatch)
    (why,) = converted.direct_refusals.values()
    assert reason in why
    assert len(converted.programs) == 1
    ex_losses, ex_state, _ = train_cerebrax(build, name, "export", monkeypatch)
    assert losses == ex_losses  # the same exported program
    assert_states_close(state, ex_state, rtol=0, atol=0)
    if name in ("custom_function", "tensor_hook", "module_hook"):  # deterministic
        eager_losses, eager_state = train_eager(build, name)
        np.testing.assert_allclose(losses, eager_losses, rtol=2e-5)
        assert_states_close(state, eager_state, rtol=1e-4, atol=1e-5)


def test_parameter_data_and_detach_in_forward_carry_no_gradient(monkeypatch):
    """``p.data`` and ``p.detach()`` read in ``forward`` are constants to the gradient, as
    in torch (the export cannot capture ``p.data``)."""

    class Penalized(Tabular):
        def forward(self, x):
            y = super().forward(x)
            return y + (self.fc.weight.data ** 2).sum() * 0.1 + self.fc.bias.detach().sum()

    losses, state, converted = train_cerebrax(Penalized, "tabular", "auto", monkeypatch)
    assert converted.direct_refusals == {} and converted.programs == []
    eager_losses, eager_state = train_eager(Penalized, "tabular")
    np.testing.assert_allclose(losses, eager_losses, rtol=2e-5)
    assert_states_close(state, eager_state, rtol=1e-4, atol=1e-5)


def test_a_forward_branching_on_a_value_raises_the_exports_error(monkeypatch):
    class Branch(Tabular):
        def forward(self, x):
            y = super().forward(x)
            if y.sum() > 0:  # a tensor's value
                return y
            return -y

    with pytest.raises(TensorReadError, match="if y.sum"):
        train_cerebrax(Branch, "tabular", "auto", monkeypatch)


def test_an_output_no_graph_can_return_raises_the_exports_error(monkeypatch):
    class Odd(Tabular):
        def forward(self, x):
            return {"logits": super().forward(x), "obj": object()}

    cstorch.reset()
    model = Odd().train()
    compiled = cstorch.compile(model, "CPU")
    monkeypatch.setenv("CEREBRAX_TORCH_CAPTURE", "auto")

    @cstorch.trace
    def step(x):
        return compiled(x)["logits"].sum()

    with pytest.raises(ConfigError, match="returns a"):
        step(data("tabular", 0)[0])
    (why,) = compiled._adapter.converted.direct_refusals.values()
    assert "output of type object" in why


def test_an_unknown_capture_setting_is_refused(monkeypatch):
    monkeypatch.setenv("CEREBRAX_TORCH_CAPTURE", "fast")
    with pytest.raises(ValueError, match="CEREBRAX_TORCH_CAPTURE='fast'"):
        train_cerebrax(Tabular, "tabular", "fast", monkeypatch)


def test_a_call_outside_a_step_is_traced_directly_with_the_exports_result(monkeypatch):
    cstorch.reset()
    torch.manual_seed(0)
    model = CausalLM().eval()
    reference = copy.deepcopy(model)
    compiled = cstorch.compile(model, "CPU")
    x = data("causal_lm", 0)[0]
    out = np.asarray(compiled(x))
    assert compiled._adapter.converted.programs == []
    np.testing.assert_allclose(out, reference(x).detach().numpy(), rtol=1e-5, atol=1e-6)


# ---- batch norm on JaxTensors -----------------------------------------------------------
def test_batch_norm_on_jax_tensors_updates_its_running_statistics_as_torch():
    torch.manual_seed(0)
    x = torch.randn(6, 4)
    mean0, var0 = torch.randn(4), torch.rand(4) + 0.5
    mean, var = mean0.clone(), var0.clone()
    expected = torch.nn.functional.batch_norm(x, mean, var, None, None, True, 0.1, 1e-5)
    jmean, jvar = JaxTensor(jnp.asarray(mean0.numpy())), JaxTensor(jnp.asarray(var0.numpy()))
    out = torch.nn.functional.batch_norm(JaxTensor(jnp.asarray(x.numpy())), jmean, jvar,
                                         None, None, True, 0.1, 1e-5)
    np.testing.assert_allclose(np.asarray(out._jax), expected.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(jmean._jax), mean.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(jvar._jax), var.numpy(), rtol=1e-6, atol=1e-7)


def test_batch_norm_writing_a_plain_torch_tensor_on_jax_values_is_refused():
    x = JaxTensor(jnp.ones((3, 4)))
    with pytest.raises(UnsupportedOpError, match="running statistics in place"):
        torch.nn.functional.batch_norm(x, torch.zeros(4), torch.ones(4), None, None, True)


# ---- start-up -------------------------------------------------------------------------------
def test_a_directly_traced_step_imports_neither_dynamo_nor_export():
    """What the direct trace saves at start-up: torch.export's machinery (about 2 s of a
    cold first step on a CPU) is never imported."""
    script = textwrap.dedent("""
        import sys
        import torch
        import cerebrax as cstorch
        sys.path.insert(0, sys.argv[1])
        from test_direct_trace import CausalLM, data
        model = CausalLM()
        compiled = cstorch.compile(model, "CPU")
        optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-3)
        loss_fn = torch.nn.CrossEntropyLoss()

        @cstorch.trace
        def step(x, y):
            loss = loss_fn(compiled(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            return loss

        print(float(step(*data("causal_lm", 0)).detach()))
        print(sorted(m for m in ("torch._dynamo", "torch.export._trace") if m in sys.modules))
    """)
    env = {k: v for k, v in os.environ.items() if k != "CEREBRAX_TORCH_CAPTURE"}
    done = subprocess.run([sys.executable, "-c", script, os.path.dirname(__file__)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    loss, imported = done.stdout.strip().splitlines()[-2:]
    assert math.isfinite(float(loss))
    assert imported == "[]"
