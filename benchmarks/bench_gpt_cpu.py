"""A GPT-style training step on CPU: cerebrax against the same step hand-written in JAX.

Hugging Face's ``GPT2LMHeadModel`` (random weights, dropout off) trains with AdamW in
float32 three ways, each built once from the same initial weights (the systems of
``bench_gpu.py``):

- torch eager (``torch.optim.AdamW``);
- the hand-written ``jax.jit`` + optax GPT-2 of ``bench_gpu.py`` (XLA's attention);
- cerebrax: ``cstorch.compile`` of the HF module and a traced step.

After warm-up steps, rounds alternate ``--steps`` steps of each system, in an order that
rotates every round, after ``--settle`` seconds idle (on 2 cores torch's OpenMP threads and
XLA's pool slow each other while they spin down). Each round ends by reading the last
loss, which waits for the step. The ratios are medians of the per-round ratios, with their
range over rounds.

    python benchmarks/bench_gpt_cpu.py [--size tiny|small|gpt2] [--rounds 9] [--steps 5]

``tiny``: bench_gpu.py's CI size. ``small``: 4 layers, width 256, 4 heads, vocabulary
1024, sequence 128, batch 8 (3.5M parameters). ``gpt2``: the published 124M model at
sequence 128, batch 4.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import platform
import statistics
import sys
import time

import jax
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_gpu  # noqa: E402  (the model, the data, the three systems)
from results import write_section  # noqa: E402

SIZES = {
    "tiny": bench_gpu.TINY,  # CI's run of every path
    "small": bench_gpu.Size(layers=4, d_model=256, heads=4, vocab=1024, seq=128, batch=8,
                            steps=5, warmup=2),
    "gpt2": bench_gpu.Size(layers=12, d_model=768, heads=12, vocab=50257, seq=128, batch=4,
                           steps=3, warmup=2),
}
SYSTEMS = ("torch eager", "jax.jit + optax", "cerebrax")


def timed(state, first: int, steps: int) -> float:
    """Seconds for ``steps`` steps from step index ``first``, waiting for the last."""
    start = time.perf_counter()
    for i in range(first, first + steps):
        loss = state.step(i)
    state.read(loss)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, help="steps per round and system")
    parser.add_argument("--settle", type=float, default=1.0,
                        help="idle seconds before each system's turn")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--output", default=str(pathlib.Path(__file__).with_name("RESULTS.md")))
    args = parser.parse_args()
    if jax.default_backend() != "cpu" or torch.cuda.is_available():
        sys.exit("bench_gpt_cpu.py measures the CPU; bench_gpu.py is the GPU benchmark")
    size = SIZES[args.size]
    if args.steps:
        size = dataclasses.replace(size, steps=args.steps)

    run = bench_gpu.build_run(size, size.batch)
    states, first_s, next_step, losses = {}, {}, {}, {}
    for name in SYSTEMS:
        start = time.perf_counter()
        states[name] = bench_gpu.BUILDERS[name](run, size.batch, "float32")
        losses[name] = states[name].read(states[name].step(0))
        first_s[name] = time.perf_counter() - start
        timed(states[name], 1, size.warmup)
        next_step[name] = 1 + size.warmup
    per_step: dict[str, list[float]] = {name: [] for name in SYSTEMS}
    for r in range(args.rounds):
        for name in SYSTEMS[r % 3:] + SYSTEMS[: r % 3]:
            time.sleep(args.settle)
            seconds = timed(states[name], next_step[name], size.steps)
            next_step[name] += size.steps
            per_step[name].append(seconds / size.steps)
        print(f"round {r}: " + ", ".join(f"{n} {per_step[n][-1] * 1e3:.1f} ms"
                                         for n in SYSTEMS), flush=True)

    def ratio(a: str, b: str) -> str:
        # b's time over a's: a's speed relative to b's
        each = [tb / ta for ta, tb in zip(per_step[a], per_step[b])]
        return f"{statistics.median(each):.3f} ({min(each):.3f} - {max(each):.3f})"

    params = sum(p.numel() for p in run.module.parameters())
    lines = [
        "## A GPT-style step on CPU: cerebrax against hand-written JAX "
        f"(`bench_gpt_cpu.py --size {args.size}`)",
        "",
        f"Machine: {platform.machine()}, {torch.get_num_threads()} torch threads, "
        f"{platform.system()}; jax {jax.__version__}, torch {torch.__version__}. Model: HF "
        f"GPT2LMHeadModel, {size.layers} layers, width {size.d_model}, {size.heads} heads, "
        f"vocabulary {size.vocab}, sequence {size.seq}, batch {size.batch} "
        f"({params / 1e6:.2f}M parameters), float32, AdamW. {args.rounds} rotating rounds "
        f"of {size.steps} steps per system after {size.warmup} warm-up steps; medians. "
        f"Command: `python benchmarks/bench_gpt_cpu.py --size {args.size} "
        f"--rounds {args.rounds} --steps {size.steps}`.",
        "",
        "| system | ms per step | first step s | first loss |",
        "|---|---|---|---|",
    ]
    for name in SYSTEMS:
        lines.append(f"| {name} | {statistics.median(per_step[name]) * 1e3:.1f} | "
                     f"{first_s[name]:.2f} | {losses[name]:.6f} |")
    lines += [
        "",
        "| ratio (speed, per-round medians and range) | value | target |",
        "|---|---|---|",
        f"| cerebrax / hand-written JAX | {ratio('cerebrax', 'jax.jit + optax')} | >= 0.97 |",
        f"| cerebrax / torch eager | {ratio('cerebrax', 'torch eager')} | >= 1.0 |",
        f"| hand-written JAX / torch eager | {ratio('jax.jit + optax', 'torch eager')} | |",
    ]
    text = "\n".join(lines)
    print("\n" + text)
    if not args.no_write:
        write_section(pathlib.Path(args.output), f"gpt_cpu_{args.size}", text)


if __name__ == "__main__":
    main()
