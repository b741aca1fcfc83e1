"""Small torch models for the torch_bridge tests, and the parity harness."""

from __future__ import annotations

import copy
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_bridge


# ---- models -------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self, sizes=(16, 32, 32, 4)):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = F.gelu(x) if i % 2 else torch.relu(x)
        return x


class CNN(nn.Module):
    def __init__(self, p: float = 0.0):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=2, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.drop = nn.Dropout(p)
        self.fc = nn.Linear(8 * 2 * 2, 5)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.pool(F.relu(self.bn2(self.conv2(x))))
        return self.fc(self.drop(x.flatten(1)))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    def __init__(self, classes=6):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU())
        self.layer1 = BasicBlock(8, 8)
        self.layer2 = BasicBlock(8, 16, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class CausalSelfAttention(nn.Module):
    def __init__(self, d, heads, p):
        super().__init__()
        self.heads, self.p = heads, p
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.p if self.training else 0.0)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, d))


class GPTBlock(nn.Module):
    def __init__(self, d, heads, p):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads, p)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * d, d), nn.Dropout(p))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab=50, block=16, d=32, heads=4, layers=2, p=0.0):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(block, d)
        self.drop = nn.Dropout(p)
        self.blocks = nn.ModuleList(GPTBlock(d, heads, p) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class Recurrent(nn.Module):
    def __init__(self, cell=nn.LSTM, features=8, hidden=16, layers=2, bidirectional=False):
        super().__init__()
        self.rnn = cell(features, hidden, num_layers=layers, batch_first=True,
                        bidirectional=bidirectional)
        self.head = nn.Linear(hidden * (2 if bidirectional else 1), 3)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.head(y[:, -1])


class Encoder(nn.Module):
    def __init__(self, d=32, heads=4, layers=2):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, heads, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.encoder(x, mask=mask, is_causal=True)


class UNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc1 = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.enc2 = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())
        self.pool = nn.MaxPool2d(2)
        self.bottom = nn.Conv2d(16, 16, 3, padding=1)
        self.up1 = nn.ConvTranspose2d(16, 16, 2, stride=2)
        self.dec2 = nn.Conv2d(32, 8, 3, padding=1)
        self.up2 = nn.ConvTranspose2d(8, 8, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.dec1 = nn.Conv2d(16, 2, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        b = F.relu(self.bottom(self.pool(e2)))
        d2 = F.relu(self.dec2(torch.cat([self.up1(b), e2], 1)))
        d1 = self.dec1(torch.cat([self.up2(d2), e1], 1))
        half = F.interpolate(d1, scale_factor=0.5, mode="bilinear", align_corners=False)
        return d1 + F.interpolate(half, size=d1.shape[-2:], mode="nearest")


# ---- harness ------------------------------------------------------------------------
def rel_err(a, b, floor: float = 1e-30) -> float:
    """||a - b|| / ||b||, with ||b|| at least ``floor`` (a gradient that is zero in exact
    arithmetic, e.g. a conv bias before train-mode BatchNorm, is rounding noise in both)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), floor))


def to_np(t):
    return t.detach().numpy()


def _leaves(out):
    if isinstance(out, (tuple, list)):
        return [y for o in out for y in _leaves(o)]
    return [out]


def compare(module: nn.Module, inputs: tuple, *, train: bool, key=None):
    """Runs ``module`` in torch and through the bridge (forward + gradient of a weighted
    sum of the outputs). Returns a dict of relative errors and the converted object."""
    torch.manual_seed(0)
    ref = copy.deepcopy(module).train(train)
    ref.zero_grad()
    out = ref(*inputs)
    outs = _leaves(out)
    gen = torch.Generator().manual_seed(1)
    weights = [torch.randn(o.shape, generator=gen) for o in outs]
    sum(torch.sum(o * w) for o, w in zip(outs, weights)).backward()

    conv = torch_bridge.convert(module, train=train)
    jweights = [jnp.asarray(to_np(w)) for w in weights]
    jinputs = tuple(jnp.asarray(to_np(x)) for x in inputs)

    @jax.jit
    def loss(params, buffers):
        y, new_buffers = conv.apply(params, buffers, *jinputs, key=key)
        s = sum(jnp.sum(o * w) for o, w in zip(_leaves(y), jweights))
        return s, (y, new_buffers)

    (_, (y, new_buffers)), grads = jax.value_and_grad(loss, has_aux=True)(
        conv.params, conv.buffers)
    errors = {"out": max(rel_err(a, to_np(b)) for a, b in zip(_leaves(y), outs))}
    named = dict(ref.named_parameters())
    floor = 1e-3 * max(float(np.linalg.norm(to_np(named[n].grad))) for n in conv.params)
    errors["grad"] = max(rel_err(grads[n], to_np(named[n].grad), floor) for n in conv.params)
    ref_buffers = dict(ref.named_buffers())
    errors["buffers"] = max(
        (rel_err(new_buffers[n], to_np(ref_buffers[n])) for n in conv.buffers), default=0.0)
    return errors, conv


def assert_parity(module, inputs, *, train, out_tol=1e-5, grad_tol=1e-4, key=None):
    errors, conv = compare(module, inputs, train=train, key=key)
    assert errors["out"] <= out_tol, errors
    assert errors["grad"] <= grad_tol, errors
    assert errors["buffers"] <= out_tol, errors
    return conv


def seeded(cls, *args, seed=0, **kwargs):
    torch.manual_seed(seed)
    return cls(*args, **kwargs)


def images(n=4, c=3, size=8, seed=0):
    return torch.randn(n, c, size, size, generator=torch.Generator().manual_seed(seed))


__all__ = ["CNN", "GPT", "MLP", "Encoder", "Recurrent", "ResNet", "UNet", "assert_parity",
           "compare", "images", "math", "nn", "rel_err", "seeded", "torch"]
