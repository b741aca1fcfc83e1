"""The GPT-style torch model of the wafer tests and benchmarks (pipeline, streaming, budget).

Token and position embeddings, ``blocks`` pre-norm transformer blocks (causal
attention whose mask is carried through every block next to the residual stream, a GELU
MLP) in an ``nn.ModuleList``, a final layer norm and a head tied to the token embedding
(so the tied weight is used at both ends of the model). With ``gates`` every block
scales its attention's and its MLP's output by a learnable 0-dim parameter
(``attn(x) * a`` and ``b * mlp(x)``): parameters too small to split over a pipeline's
stages, stored whole on every device.
"""

from __future__ import annotations

import functools
import math


@functools.cache
def gpt_class(vocab: int, seq: int, width: int, heads: int, gates: bool = False):
    """The ``GPT(blocks)`` torch module class for these sizes (built once per sizes)."""
    import torch
    from torch import nn

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            # No qkv bias: the key bias has a zero gradient (softmax ignores a shift per
            # query), so AdamW would turn its rounding noise into full-size steps.
            self.qkv = nn.Linear(width, 3 * width, bias=False)
            self.proj = nn.Linear(width, width)

        def forward(self, x, mask):
            b, t, _ = x.shape
            q, k, v = (z.view(b, t, heads, width // heads).transpose(1, 2)
                       for z in self.qkv(x).split(width, dim=2))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(width // heads)
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            return self.proj((att @ v).transpose(1, 2).reshape(b, t, width))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.attn = nn.LayerNorm(width), Attention()
            self.ln2 = nn.LayerNorm(width)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                     nn.Linear(4 * width, width))
            if gates:
                self.attn_gate = nn.Parameter(torch.tensor(0.75))
                self.mlp_gate = nn.Parameter(torch.tensor(1.25))

        def forward(self, x, mask):
            if not gates:
                x = x + self.attn(self.ln1(x), mask)
                return x + self.mlp(self.ln2(x))
            x = x + self.attn(self.ln1(x), mask) * self.attn_gate
            return x + self.mlp_gate * self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self, blocks: int):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(seq, width)
            self.blocks = nn.ModuleList([Block() for _ in range(blocks)])
            self.ln_f = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab, bias=False)
            self.head.weight = self.wte.weight  # tied: used by the first and last layer

        def forward(self, idx):
            mask = torch.ones(seq, seq, dtype=torch.bool, device=idx.device).tril()
            x = self.wte(idx) + self.wpe(torch.arange(seq, device=idx.device))
            for block in self.blocks:
                x = block(x, mask)
            return self.head(self.ln_f(x))

    return GPT


def gpt(blocks: int, *, vocab: int, seq: int, width: int, heads: int, seed: int = 0,
        gates: bool = False):
    """A ``GPT`` of ``blocks`` blocks with torch's default initialization under ``seed``
    (a test that builds one is skipped where torch is not installed)."""
    try:
        import torch
    except ModuleNotFoundError:
        import pytest

        pytest.skip("the GPT model is a torch module, and torch is not installed")

    torch.manual_seed(seed)
    return gpt_class(vocab, seq, width, heads, gates)(blocks)


def adamw_step(model, vocab: int, **adamw):
    """A traced training step of a compiled GPT: token cross-entropy, AdamW(``**adamw``)."""
    import cerebrax as cstorch
    from helpers import xent

    optimizer = cstorch.optim.AdamW(model.parameters(), **adamw)

    @cstorch.trace
    def training_step(x, y):
        loss = xent(model(x).reshape(-1, vocab), y.reshape(-1))
        cstorch.backward(loss)
        optimizer.step()
        return loss

    return training_step
