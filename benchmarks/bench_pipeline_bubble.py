"""The pipeline bubble of the GPipe and circular schedules, counted from the executed program.

A ``LAYERS``-layer MLP given as ``FunctionalModel(layers=...)`` trains one compiled step
in pipeline mode on 8 emulated CPU devices for ``S`` = 2, 4, 8 stage devices and
``M`` = S, 2S, 4S micro-batches (``MICRO`` rows each), with
``pipeline_schedule="gpipe"`` (``V = 1``) and ``"circular"`` with ``V`` = 2 and 4
virtual stages per device (where the model has ``S * V`` layers). Inside
``cerebrax.wse._pipeline.recording_schedule()`` the step's program also reports which
(micro-batch, virtual stage) every device ran at every tick, from the branch of the
schedule's switch that ran. The table gives the ticks, the idle (device, tick) slots
and their fraction, next to the closed form: ``(S-1)/(M+S-1)`` for GPipe and
``(S-1)/(M*V+S-1)`` for circular, in units of one virtual stage's work (a circular
tick does ``1/V`` of a GPipe tick's work, so the bubble shrinks at the same total work).

The idle fraction is counted from the executed schedule, not timed: 8 emulated devices
are threads on a 2-core machine, which cannot give meaningful wall-time bubbles.

    python benchmarks/bench_pipeline_bubble.py            # prints the table
    python benchmarks/bench_pipeline_bubble.py --write    # and writes RESULTS.md's section
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

FLAG = "--xla_force_host_platform_device_count=8"
if FLAG not in os.environ.get("XLA_FLAGS", ""):  # XLA reads the flag once, at start-up
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + FLAG).strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import cerebrax as cstorch  # noqa: E402
from cerebrax.wse import recording_schedule  # noqa: E402

LAYERS = 32  # enough for S * V = 8 * 4 virtual stages
WIDTH = 16
MICRO = 4  # rows per micro-batch
STAGES = (2, 4, 8)
SCHEDULES = (("gpipe", 1), ("circular", 2), ("circular", 4))


def layered_mlp(seed: int = 0) -> cstorch.FunctionalModel:
    """``LAYERS`` tanh layers of ``WIDTH`` units as a list of layers."""
    keys = jax.random.split(jax.random.key(seed), LAYERS)

    def dense(p, x):
        return jnp.tanh(x @ p["weight"] + p["bias"])

    return cstorch.FunctionalModel(layers={
        f"fc{i}": (dense, {"weight": jax.random.normal(k, (WIDTH, WIDTH)) / np.sqrt(WIDTH),
                           "bias": jnp.zeros((WIDTH,))})
        for i, k in enumerate(keys)})


def executed_schedule(stages: int, count: int, schedule: str, repeats: int) -> np.ndarray:
    """One training step's ``[S, ticks, 2]`` record (virtual stage, micro-batch; -1 idle)."""
    cstorch.reset()
    cstorch.amp.set_half_dtype("float32")
    fields = dict(execution_mode="pipeline", num_stages=stages, micro_batch_size=MICRO,
                  pipeline_schedule=schedule)
    if schedule == "circular":
        fields["pipeline_repeats"] = repeats
    backend = cstorch.backend("CSX", cluster_config=cstorch.distributed.ClusterConfig(**fields))
    model = cstorch.compile(layered_mlp(), backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.01)

    @cstorch.trace
    def training_step(x, y):
        loss = optax.l2_loss(model(x), y).mean()
        cstorch.backward(loss)
        optimizer.step()
        return loss

    rng = np.random.default_rng(0)
    x, y = (rng.normal(size=(count * MICRO, WIDTH)).astype(np.float32) for _ in range(2))
    with recording_schedule() as records:
        float(training_step(x, y))  # host sync: the step has run, its record is in
    (record,) = records
    return record[0]  # the one system


def row(stages: int, count: int, schedule: str, repeats: int) -> str:
    """The table row of one run: measured idle slots next to the closed form."""
    record = executed_schedule(stages, count, schedule, repeats)
    ticks = record.shape[1]
    idle = int((record[..., 0] < 0).sum())
    busy = {tuple(p) for p in record.reshape(-1, 2) if p[0] >= 0}
    assert len(busy) == count * stages * repeats == record[..., 0].size - idle
    formula = (stages - 1) / (count * repeats + stages - 1)
    return (f"| {stages} | {count} | {schedule} | {repeats} | {ticks} | {idle} | "
            f"{idle / record[..., 0].size:.4f} | {formula:.4f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write RESULTS.md's section")
    args = parser.parse_args()
    assert jax.device_count() == 8, jax.devices()
    lines = [
        "## Pipeline bubble: GPipe and circular schedules (`bench_pipeline_bubble.py`)\n",
        f"MLP of {LAYERS} layers ({WIDTH} wide), micro-batches of {MICRO} rows, one "
        "training step on 8 emulated CPU devices; idle = (device, tick) slots in which "
        "the executed program ran no virtual stage (counted from the program's own "
        "record, not timed). Formula: (S-1)/(M+S-1) for GPipe, (S-1)/(M*V+S-1) for "
        "circular.\n",
        "| S | M | schedule | V | ticks | idle slots | measured idle | formula |",
        "|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for stages in STAGES:
        for count in (stages, 2 * stages, 4 * stages):
            for schedule, repeats in SCHEDULES:
                if stages * repeats <= LAYERS:
                    lines.append(row(stages, count, schedule, repeats))
                    print(lines[-1], flush=True)
    if args.write:
        root = pathlib.Path(__file__).resolve().parent
        sys.path.insert(0, str(root))
        from results import write_section

        write_section(root / "RESULTS.md", "pipeline-bubble", "\n".join(lines))


if __name__ == "__main__":
    main()
