"""A torch GPT trained by torch eager and by cerebrax (through torch_bridge), one process.

The model is defined once, in torch: a GPT-2-style decoder (d=256, 4 layers, 4 heads,
T=128, batch 8, vocabulary 1024 tied with the output head: 3.45M parameters), float32,
AdamW. torch eager trains a copy of the module; cerebrax trains the module through
``cstorch.compile(module, "CPU")`` + ``cstorch.optim.AdamW(module.parameters())`` + a
traced step, with the loss module converted by ``torch_bridge.convert``. Rounds
alternate between the two and the medians are reported, with the conversion time
(export + trace + XLA compile, i.e. the first step).

    python benchmarks/bench_torch_gpt.py              # prints the table, writes RESULTS.md
    python benchmarks/bench_torch_gpt.py --hlo DIR    # also dumps the step's optimized HLO
"""

from __future__ import annotations

import argparse
import copy
import os
import pathlib
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from results import write_section

import cerebrax as cstorch
import torch_bridge

VOCAB, BLOCK, D, HEADS, LAYERS, BATCH = 1024, 128, 256, 4, 4, 8
LR, WEIGHT_DECAY = 3e-4, 0.1


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, HEADS, d // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(D)
        self.attn = Attention()
        self.ln2 = nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, D)
        self.wpe = nn.Embedding(BLOCK, D)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def make_batches(n: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        tokens = torch.randint(0, VOCAB, (BATCH, BLOCK + 1), generator=gen)
        out.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    return out


class TorchEager:
    name = "torch eager"

    def __init__(self, module: nn.Module, batches):
        self.model = module.train()
        self.batches = batches
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=LR,
                                           weight_decay=WEIGHT_DECAY)
        self.loss_fn = nn.CrossEntropyLoss()

    def step(self, x, y) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(x).view(-1, VOCAB), y.view(-1))
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def run(self, steps: int) -> float:
        start = time.perf_counter()
        for i in range(steps):
            self.step(*self.batches[i % len(self.batches)])
        return steps / (time.perf_counter() - start)


class Cerebrax:
    name = "cerebrax (cstorch.compile of the torch module)"

    def __init__(self, module: nn.Module, batches):
        self.batches = [(jnp.asarray(x.numpy()), jnp.asarray(y.numpy())) for x, y in batches]
        self.model = cstorch.compile(module.train(), "CPU")
        self.optimizer = cstorch.optim.AdamW(module.parameters(), lr=LR,
                                             weight_decay=WEIGHT_DECAY)
        loss_fn = torch_bridge.convert(nn.CrossEntropyLoss())

        @cstorch.trace
        def training_step(x, y):
            logits = self.model(x)
            loss = loss_fn(logits.reshape(-1, VOCAB), y.reshape(-1))
            cstorch.backward(loss)
            self.optimizer.step()
            self.optimizer.zero_grad()
            return loss

        self.step = training_step

    def run(self, steps: int) -> float:
        start = time.perf_counter()
        loss = None
        for i in range(steps):
            loss = self.step(*self.batches[i % len(self.batches)])
        loss.block_until_ready()
        return steps / (time.perf_counter() - start)


def median_rates(variants: dict, rounds: int) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            rates[name].append(fn())
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="steps per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--hlo", help="directory to dump the optimized HLO of the step into")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--output", default=str(pathlib.Path(__file__).with_name("RESULTS.md")))
    args = parser.parse_args()
    if args.hlo:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + f" --xla_dump_to={args.hlo} --xla_dump_hlo_as_text")

    torch.manual_seed(0)
    module = GPT()
    n_params = sum(p.numel() for p in module.parameters())
    batches = make_batches()
    eager = TorchEager(copy.deepcopy(module), batches)

    start = time.perf_counter()
    torch_bridge.convert(module, (batches[0][0],), train=True)
    export_s = time.perf_counter() - start
    start = time.perf_counter()
    ours = Cerebrax(module, batches)
    first_loss = float(ours.step(*ours.batches[0]))
    first_step_s = time.perf_counter() - start
    torch_first = float(eager.step(*batches[0]))
    loss_rel = abs(first_loss - torch_first) / abs(torch_first)

    for _ in range(2):  # warm both
        eager.run(2)
        ours.run(2)
    rates = median_rates({TorchEager.name: lambda: eager.run(args.steps),
                          Cerebrax.name: lambda: ours.run(args.steps)}, args.rounds)
    med = {name: statistics.median(r) for name, r in rates.items()}
    ratio = med[Cerebrax.name] / med[TorchEager.name]
    round_ratios = [a / b for a, b in zip(rates[Cerebrax.name], rates[TorchEager.name])]

    machine = (f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}; "
               f"torch {torch.__version__} ({torch.get_num_threads()} threads), "
               f"jax {jax.__version__}, backend {jax.default_backend()}")
    lines = [
        "## A torch GPT: torch eager vs cerebrax through torch_bridge",
        "",
        f"Machine: {machine}. Model: GPT decoder defined in torch, d={D}, {LAYERS} layers, "
        f"{HEADS} heads, T={BLOCK}, batch {BATCH}, vocabulary {VOCAB} (tied head), "
        f"{n_params / 1e6:.2f}M parameters, float32, AdamW, cross-entropy. "
        f"{args.rounds} alternating rounds of {args.steps} steps; medians. "
        "Command: `python benchmarks/bench_torch_gpt.py`.",
        "",
        "| measurement | value |",
        "|---|---|",
        *[f"| {name}, steps/s | {rate:.2f} |" for name, rate in med.items()],
        f"| cerebrax / torch eager | {ratio:.3f} (rounds: "
        f"{min(round_ratios):.2f}-{max(round_ratios):.2f}; target >= 1.0) |",
        f"| torch.export to core ATen (convert) | {export_s:.2f} s |",
        f"| conversion: first cerebrax step (export + trace + XLA compile) | "
        f"{first_step_s:.2f} s |",
        f"| first-step loss, relative difference to torch | {loss_rel:.1e} |",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section(pathlib.Path(args.output), "torch_gpt", text)


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
