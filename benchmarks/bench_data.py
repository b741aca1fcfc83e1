"""Training fed by the cstorch DataLoader: against a hand-written loop, and against data
already on the device.

The fair comparison (the headline ratio): both sides iterate the same torch
``DataLoader`` and feed its batches to the same ``jax.jit`` training step (the MLP with
optax's AdamW, parameters and optimizer state donated). The hand-written loop converts
each batch with one ``jax.device_put`` and calls the step; the cerebrax side wraps the
torch loader in ``cstorch.utils.data.DataLoader`` and iterates a ``DataExecutor``
(default settings: step closures, rate tracker, batch checks, placement), so the ratio
is the cost of cerebrax's data path and loop alone.

The two loops run in short back-to-back pairs, in turn first, and the headline is the
median of the pairs' ratios: load from other processes comes in bursts of seconds,
which the two halves of a pair mostly share.

The other rows keep the earlier measurements: a ``@cstorch.trace`` step fed by the
DataLoader, by a background streaming thread, and with the batches pre-placed on the
device, which bounds what overlapping the input with the step can gain (alternating
rounds; medians).

    python benchmarks/bench_data.py              # prints the tables, updates RESULTS.md
    python benchmarks/bench_data.py --fair-only --output /tmp/results.md
"""

from __future__ import annotations

import argparse
import os
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
NUM_SAMPLES = 32 * BATCH


def init_params(seed: int = 0) -> dict:
    keys = jax.random.split(jax.random.key(seed), len(SIZES) - 1)
    return {f"fc{i + 1}": {"weight": jax.random.normal(k, (a, b)) / np.sqrt(a),
                           "bias": jnp.zeros(b)}
            for i, (k, a, b) in enumerate(zip(keys, SIZES[:-1], SIZES[1:]))}


def apply(params: dict, x: jax.Array) -> jax.Array:
    for i in range(len(SIZES) - 1):
        layer = params[f"fc{i + 1}"]
        x = x @ layer["weight"] + layer["bias"]
        if i < len(SIZES) - 2:
            x = jax.nn.relu(x)
    return x


def torch_input_fn(batch_size: int) -> torch.utils.data.DataLoader:
    """What a ported script's input_fn returns: a torch DataLoader over a dataset."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(NUM_SAMPLES, SIZES[0], generator=generator)
    y = torch.randint(0, SIZES[-1], (NUM_SAMPLES,), generator=generator)
    dataset = torch.utils.data.TensorDataset(x, y)
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, drop_last=True)


def loss_fn(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(apply(params, x), y).mean()


TX = optax.adamw(1e-3)


def train_step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y.astype(jnp.int32))
    updates, opt_state = TX.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


jit_step = jax.jit(train_step, donate_argnums=(0, 1))


def epochs(loader, steps: int):
    """``steps`` batches of ``loader``, restarting it at the end of each pass."""
    n = 0
    while True:
        for batch in loader:
            if n == steps:
                return
            yield batch
            n += 1


def traced_rows(args: argparse.Namespace) -> list[str]:
    """The traced cerebrax step fed by the DataLoader, a background thread, or batches
    already on the device; the lines of its tables."""
    model = cstorch.compile(cstorch.FunctionalModel(apply, init_params()), "CPU")
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-3)

    @cstorch.trace
    def training_step(x, y):
        loss = optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()
        cstorch.backward(loss)
        optimizer.step()
        return loss

    placed = [(jnp.asarray(x.numpy()), jnp.asarray(y.numpy().astype(np.int32)))
              for x, y in torch_input_fn(BATCH)]

    def traced(loader: cstorch.utils.data.DataLoader) -> float:
        executor = cstorch.utils.data.DataExecutor(loader, num_steps=args.steps,
                                                   progress_bar=False)
        start = time.perf_counter()
        loss = None
        for x, y in executor:
            loss = training_step(x, y.astype(jnp.int32))
        loss.block_until_ready()
        return args.steps / (time.perf_counter() - start)

    def in_thread(loader: cstorch.utils.data.DataLoader) -> cstorch.utils.data.DataLoader:
        loader.background = True
        return loader

    def host_cost() -> float:
        """Seconds per batch to iterate the torch DataLoader, convert and place, alone."""
        source = torch_input_fn(BATCH)
        start, last = time.perf_counter(), None
        for x, y in epochs(source, args.steps):
            last = jax.device_put((x.numpy(), y.numpy()))
        jax.block_until_ready(last)
        return (time.perf_counter() - start) / args.steps

    variants = {
        "traced step, DataLoader (torch DataLoader input_fn)": lambda: traced(
            cstorch.utils.data.DataLoader(torch_input_fn, BATCH, num_steps=args.steps)),
        "traced step, same, streamed by a background thread": lambda: traced(in_thread(
            cstorch.utils.data.DataLoader(torch_input_fn, BATCH, num_steps=args.steps))),
        "traced step, same batches pre-placed on the device": lambda: traced(
            cstorch.utils.data.DataLoader(lambda: placed, num_steps=args.steps)),
    }
    for fn in variants.values():  # warm up: compile, start threads
        fn()
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            rates[name].append(fn())
    medians = {name: statistics.median(r) for name, r in rates.items()}
    names = list(variants)
    ratio = medians[names[0]] / medians[names[2]]
    ratio_thread = medians[names[1]] / medians[names[2]]
    cost = statistics.median(host_cost() for _ in range(3))
    # With no core to spare, reading a batch adds its host cost to every step.
    serial = (1 / medians[names[2]]) / (1 / medians[names[2]] + cost)
    return [
        "",
        f"Traced cerebrax step (`@cstorch.trace`, `cstorch.optim.AdamW`): {args.rounds} "
        f"alternating rounds of {args.steps} steps through DataExecutor; medians.",
        "",
        "| measurement | steps/s |",
        "|---|---|",
        *[f"| {name} | {rate:.1f} |" for name, rate in medians.items()],
        "",
        "| ratio | value |",
        "|---|---|",
        f"| traced step: DataLoader / pre-placed | {ratio:.3f} |",
        f"| traced step: DataLoader in a background thread / pre-placed | {ratio_thread:.3f} |",
        f"| no-overlap bound: step / (step + host cost of a batch) | {serial:.3f} |",
        "",
        f"Host cost of one batch alone (torch DataLoader iteration, conversion, "
        f"`device_put`): {cost * 1e6:.0f} us, against {1e6 / medians[names[2]]:.0f} us per "
        "pre-placed traced step. Against pre-placed batches the input's host work",
        "competes with XLA's step for the same cores, so only part of it hides behind the",
        "asynchronous step.",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=40,
                        help="back-to-back pairs of the fair comparison")
    parser.add_argument("--pair-steps", type=int, default=64, help="steps per side of a pair")
    parser.add_argument("--fair-only", action="store_true",
                        help="only the fair comparison, not the traced-step rows")
    parser.add_argument("--output", default=str(pathlib.Path(__file__).with_name("RESULTS.md")))
    args = parser.parse_args()

    # ---- the fair comparison: the same torch loader, the same jitted step ----
    state = {"params": init_params(), "opt": None}
    state["opt"] = TX.init(state["params"])

    steps = args.pair_steps

    def timed(batches) -> tuple[float, float]:
        """Steps/s of the jitted step over ``batches`` (JAX arrays), and the stepping
        thread's CPU time per step in us (the host work, much less sensitive than wall
        time to other processes on the machine)."""
        params, opt = state["params"], state["opt"]
        start, cpu = time.perf_counter(), time.thread_time()
        loss = None
        for x, y in batches:
            params, opt, loss = jit_step(params, opt, x, y)
        loss.block_until_ready()
        state["params"], state["opt"] = params, opt
        return (steps / (time.perf_counter() - start),
                (time.thread_time() - cpu) / steps * 1e6)

    def hand_loop() -> tuple[float, float]:
        source = torch_input_fn(BATCH)
        return timed(jax.device_put((x.numpy(), y.numpy())) for x, y in epochs(source, steps))

    def cerebrax_loop() -> tuple[float, float]:
        loader = cstorch.utils.data.DataLoader(torch_input_fn, BATCH, num_steps=steps)
        return timed(cstorch.utils.data.DataExecutor(loader))

    # Short back-to-back pairs, in turn first: other load on the machine comes in bursts
    # of seconds, which a pair's two halves mostly share.
    hand_loop(), cerebrax_loop()  # warm up: compile
    fair_rates: dict[str, list[float]] = {"hand": [], "ours": []}
    host_us: dict[str, list[float]] = {"hand": [], "ours": []}
    for i in range(args.pairs):
        first, second = ("hand", "ours") if i % 2 == 0 else ("ours", "hand")
        for side in (first, second):
            rate, cpu = hand_loop() if side == "hand" else cerebrax_loop()
            fair_rates[side].append(rate)
            host_us[side].append(cpu)
    pairs = sorted(o / h for o, h in zip(fair_rates["ours"], fair_rates["hand"]))
    extra_us = statistics.median(o - h for o, h in zip(host_us["ours"], host_us["hand"]))
    fair = statistics.median(pairs)
    quartiles = statistics.quantiles(pairs, n=4)

    traced_lines = [] if args.fair_only else traced_rows(args)
    machine = (f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}; "
               f"jax {jax.__version__}, torch {torch.__version__}")
    hand_rate, ours_rate = (statistics.median(fair_rates[k]) for k in ("hand", "ours"))
    text = "\n".join([
        "## Data loading: the cstorch DataLoader against a hand-written loop",
        "",
        f"Machine: {machine}. MLP {'-'.join(map(str, SIZES))}, batch {BATCH}, AdamW, "
        "float32, CPU backend. Command: `python benchmarks/bench_data.py "
        f"--pairs {args.pairs} --pair-steps {args.pair_steps} --steps {args.steps} "
        f"--rounds {args.rounds}{' --fair-only' if args.fair_only else ''}`.",
        "",
        f"Fair comparison: {args.pairs} back-to-back pairs of {args.pair_steps} steps, in "
        "turn first; both sides iterate the same torch DataLoader and call the same "
        "`jax.jit` step (optax AdamW, donated state).",
        "",
        "| loop | steps/s (median) | stepping thread's CPU per step (median) |",
        "|---|---|---|",
        f"| hand-written: torch DataLoader -> `jax.device_put` -> jitted step | "
        f"{hand_rate:.1f} | {statistics.median(host_us['hand']):.0f} us |",
        f"| cstorch DataLoader + DataExecutor -> the same jitted step | {ours_rate:.1f} | "
        f"{statistics.median(host_us['ours']):.0f} us |",
        "",
        "| ratio | value | target |",
        "|---|---|---|",
        f"| cstorch / hand-written, median of the pairs | {fair:.3f} | >= 0.97 |",
        f"| the same, quartiles (min - max) | {quartiles[0]:.3f} - {quartiles[2]:.3f} "
        f"({pairs[0]:.3f} - {pairs[-1]:.3f}) | |",
        f"| cerebrax's extra CPU in the stepping thread, per step (median of the pairs) | "
        f"{extra_us:.0f} us of {1e6 / hand_rate:.0f} us per hand-written step | |",
        "",
        "Both loops pay for the torch DataLoader and the copy to the device, so the ratio",
        "measures what cerebrax's data path (conversion, batch checks, placement) and the",
        "DataExecutor (closures, checkpoint steps, rate tracker, progress) add per step.",
        *traced_lines,
    ])
    print(text)
    write_section(pathlib.Path(args.output), "data", text)


if __name__ == "__main__":
    main()
