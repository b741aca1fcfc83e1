"""XLA temporaries of torch attention through torch_bridge, with and without its rewrites.

``nn.MultiheadAttention(batch_first=True)`` exports its input projection as a batched
product against the weight expanded once per sequence position, and unpacks q, k, v with
one ``select`` each; ``torch_bridge/_rewrites.py`` turns the first into one matmul and
the second into one split. For ``nn.MultiheadAttention(768, 12)`` and a 2-layer
``nn.TransformerEncoder`` of ``nn.TransformerEncoderLayer(768, 12, 3072)`` (ViT-B/16
sizes) on a (4, 197, 768) input, this prints the temporary bytes XLA allocates
(``compile().memory_analysis().temp_size_in_bytes``; compiled, not run) for the forward
and for the gradient in parameters and input: "before" is the export lowered without
the rewrites, "after" with them (what ``torch_bridge.convert`` does), "plain" the same
model written by hand in JAX (``q, k, v = x @ W.T + b``, then attention).

    python benchmarks/bench_mha_memory.py
"""

from __future__ import annotations

import contextlib
import pathlib
import platform
import sys
from unittest import mock

import jax
import jax.numpy as jnp
import torch
import torch.nn as nn

import torch_bridge
from torch_bridge import _export

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "torch_bridge"))
from test_bridge_memory import (  # noqa: E402  (the reference models live with their test)
    BATCH, D, FF, HEADS, SEQ, SelfAttention, reference_attention, reference_encoder_layer,
    temp_bytes, vjp,
)

LAYERS = 2


def encoder() -> nn.Module:
    layer = nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)


def reference_encoder(p: dict, x: jax.Array) -> jax.Array:
    for i in range(LAYERS):
        prefix = f"layers.{i}."
        layer = {k.removeprefix(prefix): v for k, v in p.items() if k.startswith(prefix)}
        x = reference_encoder_layer(layer, x, HEADS)
    return x


MODELS = {
    "MultiheadAttention(768, 12)": (SelfAttention,
                                    lambda p, x: reference_attention(p, x, HEADS, "attn.")),
    f"TransformerEncoder, {LAYERS} layers": (encoder, reference_encoder),
}


def _temps(module: nn.Module, reference=None, *, rewrites: bool = True) -> dict[str, int]:
    """Forward and gradient temporaries of the bridged ``module`` (exported with or
    without the rewrites), or of ``reference`` on its parameters."""
    conv = torch_bridge.convert(module)
    x = jnp.asarray(torch.randn(BATCH, SEQ, D, generator=torch.Generator().manual_seed(1)).numpy())
    ct = jnp.ones_like(x)
    skip = mock.patch.object(_export, "rewrite", lambda program: program)
    with contextlib.nullcontext() if rewrites else skip:
        conv.program((x,), {})  # exports now: later calls reuse this graph

    def bridged(p, x):
        return conv.apply(p, conv.buffers, x)[0]

    fn = bridged if reference is None else reference
    return {"forward": temp_bytes(fn, conv.params, x),
            "gradient": temp_bytes(vjp(fn), conv.params, x, ct)}


def main() -> None:
    print(f"# torch_bridge rewrites: XLA temporaries, batch {BATCH}, seq {SEQ}, d {D}")
    print(f"# jax {jax.__version__}, torch {torch.__version__}, {platform.processor() or 'cpu'}, "
          f"{jax.devices()[0].platform}")
    print("| model | pass | before (MiB) | after (MiB) | plain JAX (MiB) | after / plain |")
    print("|---|---|---:|---:|---:|---:|")
    mib = 2 ** 20
    for name, (make, reference) in MODELS.items():
        torch.manual_seed(0)
        module = make().eval()
        before = _temps(module, rewrites=False)
        after = _temps(module)
        plain = _temps(module, reference)
        for mode in ("forward", "gradient"):
            print(f"| {name} | {mode} | {before[mode] / mib:.1f} | {after[mode] / mib:.1f} | "
                  f"{plain[mode] / mib:.1f} | {after[mode] / plain[mode]:.2f} |")


if __name__ == "__main__":
    main()
