"""The casts of a bf16 training step: cerebrax against the hand-written JAX step.

Both steps of ``bench_gpu.py`` (GPT-2 124M, HF's module through cerebrax with
``cstorch.amp.set_half_dtype("bfloat16")``, and the pure-JAX GPT-2 with ``optax.adamw``,
float32 master weights cast to bf16 for the pass) are lowered for the same batch, and
their programs, as JAX hands them to XLA (StableHLO, before XLA's own passes), are read:

- every ``convert`` by direction (float32 -> bf16, bf16 -> float32, ...), with the
  elements it converts: the casts each framework adds;
- the element type of each ``exponential`` over a tensor whose last axis is the
  vocabulary: the softmax and log-softmax over the vocabulary (forward and backward),
  which torch autocast runs in float32.

Nothing is compiled or run, so it runs on any machine (seconds on a CPU) and the counts
are those of any device: XLA's passes come after and may fuse or drop converts, but not
change what the program asks for.

    python benchmarks/bf16_casts.py              # table; writes RESULTS.md, section bf16_casts
    python benchmarks/bf16_casts.py --tiny       # the CI-sized model
"""

from __future__ import annotations

import argparse
import collections
import math
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import optax
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_gpu  # noqa: E402  (the models, the data and the optimizer settings)
from results import write_section  # noqa: E402

_CONVERT = re.compile(r"stablehlo\.convert %\S+ : \(tensor<([^>]*)>\) -> tensor<([^>]*)>")
_EXP = re.compile(r"stablehlo\.exponential %\S+ : tensor<([^>]*)>")


def _shape_type(spec: str) -> tuple[tuple[int, ...], str]:
    *dims, dtype = spec.split("x")
    return tuple(int(d) for d in dims), dtype


def read(text: str, vocab: int) -> dict:
    """The converts (direction -> [count, elements]) and the vocabulary exponentials'
    element types (type -> count) of a StableHLO module's text."""
    converts: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for source, target in _CONVERT.findall(text):
        shape, a = _shape_type(source)
        _, b = _shape_type(target)
        entry = converts[f"{a} -> {b}"]
        entry[0] += 1
        entry[1] += math.prod(shape)
    exps = collections.Counter(dtype for shape, dtype in map(_shape_type, _EXP.findall(text))
                               if shape and shape[-1] == vocab)
    return {"converts": dict(converts), "vocab_exponentials": dict(exps)}


def jax_step_text(run: bench_gpu.Run, batch: int) -> str:
    size = run.size
    params = bench_gpu.jax_params(run.module)
    tx = optax.adamw(bench_gpu.ADAMW["lr"], *bench_gpu.ADAMW["betas"],
                     eps=bench_gpu.ADAMW["eps"], weight_decay=bench_gpu.ADAMW["weight_decay"])
    state = tx.init(params)

    def step(params, state, tokens):
        loss, grads = jax.value_and_grad(bench_gpu.gpt2_loss)(
            params, tokens, layers=size.layers, heads=size.heads, dtype=jnp.bfloat16,
            attention="xla")
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    tokens = jnp.asarray(run.tokens[0, :batch], jnp.int32)
    return jax.jit(step, donate_argnums=(0, 1)).lower(params, state, tokens).as_text()


def cerebrax_step_text(run: bench_gpu.Run, batch: int) -> str:
    system = bench_gpu.Cerebrax(run, batch, "bf16")
    return system.training_step.lower(system.batches[0]).as_text()


def table(rows: dict[str, dict]) -> str:
    directions = sorted({d for r in rows.values() for d in r["converts"]})
    lines = ["| convert | " + " | ".join(rows) + " |", "|---|" + "---|" * len(rows)]
    for d in directions:
        cells = []
        for r in rows.values():
            count, elements = r["converts"].get(d, (0, 0))
            cells.append(f"{count} ({elements / 1e6:.1f} M elements)")
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    lines.append("| exponentials over the vocabulary, by element type | " + " | ".join(
        ", ".join(f"{t}: {n}" for t, n in sorted(r["vocab_exponentials"].items())) or "none"
        for r in rows.values()) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="the CI-sized model")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--output", default=str(pathlib.Path(__file__).parent / "RESULTS.md"))
    args = parser.parse_args()
    size = bench_gpu.TINY if args.tiny else bench_gpu.FULL
    run = bench_gpu.build_run(size, args.batch)
    rows = {"jax.jit + optax, bf16": read(jax_step_text(run, args.batch), size.vocab),
            "cerebrax, bf16": read(cerebrax_step_text(run, args.batch), size.vocab)}
    name = "tiny GPT-2" if args.tiny else "GPT-2 124M"
    text = "\n".join([
        f"## bf16 casts of one training step ({name})",
        "",
        f"jax {jax.__version__}, torch {torch.__version__}; {size.layers} layers, d_model "
        f"{size.d_model}, vocabulary {size.vocab}, sequence {size.seq}, batch {args.batch}. "
        "Counted in each step's StableHLO, before XLA's passes. Command: `python "
        f"benchmarks/bf16_casts.py{' --tiny' if args.tiny else ''}`.",
        "",
        table(rows),
    ])
    print(text)
    if not args.tiny:
        write_section(pathlib.Path(args.output), "bf16_casts", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
