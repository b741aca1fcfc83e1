"""The cost of torch code inside a traced step, measured side by side in one process.

One torch MLP (784-256-256-10), compiled once, AdamW with a cosine schedule, two traced
steps on the same model, optimizer and batches:

- torch-native: ``loss = torch.nn.CrossEntropyLoss()(compiled(x), y)``,
  ``loss.backward()``, ``optimizer.step()``, ``optimizer.zero_grad()`` (seed 001's form);
- JAX-facing: an optax loss on the same outputs and ``cstorch.backward(loss)``.

The torch code is captured once, when the step is traced; afterwards both steps run a
compiled program, so the steady-state cost should be the same.

    python benchmarks/bench_torch_step.py       # prints the table, writes RESULTS.md

Rounds alternate between the two steps, in turn first and second; the reported ratio
is the median of the per-round ratios of their times per step, with its range.
"""

from __future__ import annotations

import argparse
import pathlib
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
from results import write_section

import cerebrax as cstorch

SIZES = (784, 256, 256, 10)
BATCH = 128
LR, END_LR, TOTAL = 1e-3, 1e-5, 10_000


def make_data(n: int = 32) -> list[tuple[jax.Array, jax.Array]]:
    """Torch batches placed as a cstorch DataLoader streams them: JAX arrays on the
    device that both steps see as torch tensors (the model then returns torch tensors)."""
    rng = np.random.default_rng(0)
    return [cstorch.data.to_device((
        torch.from_numpy(rng.normal(size=(BATCH, SIZES[0])).astype(np.float32)),
        torch.from_numpy(rng.integers(0, SIZES[-1], size=BATCH)),
    )) for _ in range(n)]


def build() -> dict:
    torch.manual_seed(0)
    layers = []
    for i, (a, b) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(SIZES) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    compiled = cstorch.compile(model, "CPU")
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    scheduler = cstorch.optim.lr_scheduler.CosineDecayLR(optimizer, LR, END_LR,
                                                         total_iters=TOTAL)
    loss_fn = torch.nn.CrossEntropyLoss()

    @cstorch.trace
    def torch_native(x, y):
        loss = loss_fn(compiled(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        return loss

    @cstorch.trace
    def jax_facing(x, y):
        logits, labels = jnp.asarray(compiled(x)), jnp.asarray(y)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        cstorch.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        return loss

    return {"torch-native step (loss module, loss.backward())": torch_native,
            "JAX-facing step (optax loss, cstorch.backward)": jax_facing}


def seconds_per_step(step, data, steps: int) -> float:
    start = time.perf_counter()
    loss = None
    for i in range(steps):
        loss = step(*data[i % len(data)])
    loss.block_until_ready()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400, help="steps per round")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--output", default=str(pathlib.Path(__file__).with_name("RESULTS.md")))
    args = parser.parse_args()

    data = make_data()
    steps = build()
    start = time.perf_counter()
    for step in steps.values():
        seconds_per_step(step, data, 20)  # traces, compiles and warms up
    first = time.perf_counter() - start
    times: dict[str, list[float]] = {name: [] for name in steps}
    for round_ in range(args.rounds):
        order = list(steps.items())
        for name, step in order if round_ % 2 == 0 else order[::-1]:  # A B, then B A
            times[name].append(seconds_per_step(step, data, args.steps))
    assert all(step.num_compiles == 1 for step in steps.values())

    native, jaxy = list(steps)
    ratios = [a / b for a, b in zip(times[native], times[jaxy])]
    ratio = f"{statistics.median(ratios):.3f} ({min(ratios):.3f} - {max(ratios):.3f})"
    lines = [
        "## Torch code inside a traced step (`bench_torch_step.py`)",
        "",
        f"Machine: {platform.machine()}, {jax.device_count()} JAX device(s) "
        f"({jax.devices()[0].platform}), torch {torch.__version__}. {args.rounds} rounds of "
        f"{args.steps} steps; medians. The ratio is the median of the per-round ratios of "
        "the times per step, with their range.",
        "",
        "| step | ms / step |",
        "|---|---|",
        *(f"| {name} | {1e3 * statistics.median(t):.3f} |" for name, t in times.items()),
        "",
        "| ratio | value | target |",
        "|---|---|---|",
        f"| torch-native time / JAX-facing time | {ratio} | <= 1.03 |",
        "",
        f"Tracing, compiling and 20 warm-up steps of both took {first:.1f} s; the torch "
        "code runs once, at the trace.",
    ]
    text = "\n".join(lines)
    print(text)
    write_section(pathlib.Path(args.output), "torch_step", text)


if __name__ == "__main__":
    main()
