"""The two figures of the documentation's page on the emulated wafer's layouts.

Both are drawn from what cerebrax records when it compiles and runs one small model on
8 emulated CPU devices, never by hand. The model: ``LAYERS`` identical layers
``tanh(x @ W + b)`` of width ``WIDTH`` as a ``cstorch.FunctionalModel(layers=...)``,
trained with AdamW on a mean squared error, one global batch of ``BATCH`` rows.

``pipeline_schedules.svg``: layer-pipelined mode (``execution_mode="pipeline"``) on
``STAGES`` stage devices with ``MICRO_BATCHES`` micro-batches, in its two schedules,
GPipe (each device runs one virtual stage of ``LAYERS / STAGES`` layers) and circular
(``pipeline_repeats=2``: each device runs two virtual stages of half as many layers,
every micro-batch goes round the ring of devices twice). One grid per schedule: device
against tick, each cell the micro-batch (and virtual stage) that device ran at that tick
as ``cerebrax.wse.recording_schedule()`` reports it from the executed program, idle
cells (the bubble) left blank. The record is of the forward pass: the backward pass is
its transpose and runs the same ticks in reverse order. The x axis is time in layer
evaluations (a tick lasts as long as its virtual stage's layers), so both schedules
share it. What the recorded data shows (S = 4 devices, M = 8 micro-batches, V = 2
virtual stages per device): both schedules leave the same number of idle (device, tick)
slots, ``S * (S - 1)`` = 12, but a circular tick runs half as many layers, so the idle
time per device halves (3 layer evaluations against 6) and the bubble's share of the
step shrinks, ``(S - 1) / (M * V + S - 1)`` = 3/19 against ``(S - 1) / (M + S - 1)`` =
3/11; the step takes 19 layer evaluations against 22. The figure's titles give these
numbers as computed from the record, and tests/multidevice/test_wafer_figures.py checks
them.

``weight_streaming_memory.svg``: the bytes one device holds for the same model's
training step in replica mode (``execution_mode="replica"``, 8 data-parallel copies)
and in weight-streaming mode (``max_wgt_servers=8``: parameters and optimizer state
split over the 8 devices, each layer's weights gathered just before use), by category:
parameters, AdamW state, other state, XLA's temporaries (activations, gathered weights,
gradients) and the peak, as ``cerebrax.wse.memory_report`` gives them for the compiled
step (XLA's memory analysis of the per-device program; nothing runs). Every device runs
the same per-device program, so the numbers hold for each of the 8. The dotted lines are
the unsharded totals of parameters and optimizer state; a category that is 0 bytes in
both modes (here the other state) is named in the title instead of drawn. Weight
streaming holds 1/8 of the parameters and AdamW moments per device, and its XLA
temporaries and peak are a fraction of replica mode's.

``wafer_figures.json`` holds the exact data drawn: the recorded schedule arrays
(``[num_csx, num_stages, ticks, 2]``: virtual stage and micro-batch, -1 where idle), the
layer ranges of the virtual stages (``cerebrax.wse.split_layers``) and the memory
reports' fields.

Run it in its own process (the devices must exist before JAX starts):

    python docs/_ext/wafer_figures.py OUT_DIR

It sets ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` itself when no device
count is given (and, run as a script, ``JAX_PLATFORMS=cpu`` when unset), and writes the
runs' artifacts to a temporary folder. :func:`write_figures` is the same from a process
that already has the 8 devices (the multi-device tests).
"""

from __future__ import annotations

import os

_DEVICE_FLAG = "--xla_force_host_platform_device_count"
if _DEVICE_FLAG not in os.environ.get("XLA_FLAGS", ""):  # read once, when JAX starts
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" {_DEVICE_FLAG}=8").strip()
if __name__ == "__main__":  # the emulated wafer is CPU devices, even where a GPU is
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")

import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

import cerebrax as cstorch  # noqa: E402
from cerebrax.wse import memory_report, recording_schedule, split_layers  # noqa: E402

__all__ = ["BATCH", "DEVICES", "LAYERS", "MEMORY_LAYOUTS", "MICRO_BATCHES", "PIPELINE_LAYOUTS",
           "STAGES", "WIDTH", "layer_costs", "training_batch", "training_step",
           "write_figures"]

DEVICES = 8
LAYERS, WIDTH, BATCH = 8, 128, 32
STAGES, MICRO_BATCHES = 4, 8
PIPELINE_LAYOUTS: dict[str, dict[str, Any]] = {
    "gpipe": dict(execution_mode="pipeline", num_stages=STAGES,
                  micro_batch_size=BATCH // MICRO_BATCHES, pipeline_schedule="gpipe"),
    "circular": dict(execution_mode="pipeline", num_stages=STAGES,
                     micro_batch_size=BATCH // MICRO_BATCHES, pipeline_schedule="circular",
                     pipeline_repeats=2),
}
MEMORY_LAYOUTS: dict[str, dict[str, Any]] = {
    "replica": dict(execution_mode="replica", num_replicas=DEVICES),
    "weight_streaming": dict(execution_mode="weight_streaming", max_wgt_servers=DEVICES),
}
SCHEDULE_TITLES = {"gpipe": "GPipe", "circular": "circular (pipeline_repeats=2)"}
MODE_TITLES = {"replica": f"replica ({DEVICES} data-parallel copies)",
               "weight_streaming": f"weight streaming ({DEVICES} weight servers)"}
# (MemoryReport field, label, unsharded-total field or None)
MEMORY_CATEGORIES = (
    ("params_bytes", "parameters", "params_total_bytes"),
    ("optimizer_bytes", "optimizer state\n(AdamW moments, step)", "optimizer_total_bytes"),
    ("other_state_bytes", "other state", None),
    ("temp_bytes", "XLA temporaries\n(activations, gathered\nweights, gradients)", None),
    ("peak_bytes", "peak\n(arguments + temporaries\n+ new outputs)", None),
)
# Text stays text (no embedded glyphs); element ids come from a fixed salt, not a random
# one; one font named (matplotlib's own), so each text element stays short.
SVG_RC = {"svg.fonttype": "none", "svg.hashsalt": "cerebrax-wafer-figures",
          "font.family": "sans-serif", "font.sans-serif": ["DejaVu Sans"], "font.size": 9}
SVG_METADATA = {"Date": None}


# ---- the model and its steps -----------------------------------------------------------
def _dense(p: dict, x: jax.Array) -> jax.Array:
    return jnp.tanh(x @ p["weight"] + p["bias"])


def _layer_params() -> list[dict[str, jax.Array]]:
    keys = jax.random.split(jax.random.key(0), LAYERS)
    return [{"weight": jax.random.normal(k, (WIDTH, WIDTH)) / math.sqrt(WIDTH),
             "bias": jnp.full((WIDTH,), 0.01)} for k in keys]


def layer_costs() -> list[int]:
    """Each layer's balancing cost as pipeline mode weighs a ``FunctionalModel`` layer:
    its parameter count."""
    return [sum(int(np.prod(x.shape)) for x in jax.tree.leaves(p)) for p in _layer_params()]


def training_batch() -> tuple[np.ndarray, np.ndarray]:
    """The one global batch every figure's step runs on: inputs and regression targets."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, WIDTH)).astype(np.float32)
    y = rng.uniform(-0.5, 0.5, size=(BATCH, WIDTH)).astype(np.float32)
    return x, y


def training_step(cluster: dict[str, Any], artifact_dir: str | None = None
                  ) -> cstorch.TracedStep:
    """A fresh float32 CSX run laid out by ``ClusterConfig(**cluster)``: the model and
    its traced AdamW training step (mean squared error)."""
    cstorch.reset()
    cstorch.amp.set_half_dtype("float32")
    backend = cstorch.backend("CSX", artifact_dir=artifact_dir,
                              cluster_config=cstorch.distributed.ClusterConfig(**cluster))
    model = cstorch.compile(cstorch.FunctionalModel(layers={
        f"fc{i + 1}": (_dense, p) for i, p in enumerate(_layer_params())}), backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

    @cstorch.trace
    def step(x: jax.Array, y: jax.Array) -> jax.Array:
        loss = jnp.mean((model(x) - y) ** 2)
        cstorch.backward(loss)
        optimizer.step()
        return loss

    return step


# ---- the recorded data -----------------------------------------------------------------
def _schedule_data(name: str, artifact_dir: str) -> dict[str, Any]:
    """Runs one pipelined step and returns its recorded schedule and what follows from it."""
    cluster = PIPELINE_LAYOUTS[name]
    step = training_step(cluster, artifact_dir)
    with recording_schedule() as records:
        loss = float(step(*training_batch()))
    if len(records) != 1:
        raise RuntimeError(f"expected one recorded schedule per step, got {len(records)}")
    record = records[0]
    repeats = cluster.get("pipeline_repeats") or 1
    ranges = split_layers(layer_costs(), STAGES * repeats)
    layers_per_tick = max(hi - lo for lo, hi in ranges)  # a tick runs one virtual stage
    idle = record[..., 0] < 0
    return {
        "cluster": cluster,
        "record": record.tolist(),
        "virtual_stage_layers": [list(r) for r in ranges],
        "layers_per_tick": layers_per_tick,
        "ticks": int(record.shape[2]),
        "idle_slots": int(idle.sum()),
        "idle_fraction": float(idle.mean()),
        "idle_layer_time_per_device": idle.sum(axis=2).max().item() * layers_per_tick,
        "step_layer_time": int(record.shape[2]) * layers_per_tick,
        "loss": loss,
    }


def _memory_data(mode: str, artifact_dir: str) -> dict[str, Any]:
    step = training_step(MEMORY_LAYOUTS[mode], artifact_dir)
    report = memory_report(step, *training_batch())
    return {"cluster": MEMORY_LAYOUTS[mode], "report": dataclasses.asdict(report)}


# ---- drawing ---------------------------------------------------------------------------
def _micro_batch_colours() -> list[tuple[float, ...]]:
    cmap = matplotlib.colormaps["tab10"]
    return [cmap(i % 10) for i in range(MICRO_BATCHES)]


def _draw_schedule(ax: Axes, name: str, data: dict[str, Any], span: int) -> None:
    record = np.asarray(data["record"])[0]  # one system: [stages, ticks, 2]
    width = data["layers_per_tick"]
    colours = _micro_batch_colours()
    stages, ticks = record.shape[:2]
    for s in range(stages):
        for t in range(ticks):
            k, m = (int(v) for v in record[s, t])
            x = t * width
            if k < 0:  # idle: the bubble
                ax.add_patch(Rectangle((x, s), width, 1, facecolor="white",
                                       edgecolor="0.75", linewidth=0.6, linestyle=":"))
                continue
            second_pass = k >= stages
            ax.add_patch(Rectangle((x, s), width, 1, facecolor=colours[m],
                                   alpha=0.55 if second_pass else 0.9,
                                   hatch="///" if second_pass else None,
                                   edgecolor="white", linewidth=1.0))
            ax.text(x + width / 2, s + 0.5, f"m{m}\nk{k}", ha="center", va="center",
                    fontsize=6.5, linespacing=0.95)
    ax.set_xlim(0, span)
    ax.set_ylim(stages, 0)  # device 0 at the top
    ax.set_yticks(np.arange(stages) + 0.5, [f"device {s}" for s in range(stages)])
    ax.set_xticks(range(0, span + 1, 2))
    ax.set_xlabel("time (layer evaluations)")
    ax.tick_params(axis="y", length=0)
    top = ax.secondary_xaxis("top", functions=(lambda x: x / width, lambda t: t * width))
    top.set_xticks([t + 0.5 for t in range(ticks)], [str(t) for t in range(ticks)])
    top.tick_params(labelsize=7, length=0)
    top.spines["top"].set_visible(False)
    top.set_xlabel("tick", fontsize=8)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    layers = "layer" if width == 1 else "layers"
    ax.set_title(
        f"{SCHEDULE_TITLES[name]}: {data['ticks']} ticks of {width} {layers} each; "
        f"{data['idle_slots']} idle (device, tick) slots, "
        f"{data['idle_layer_time_per_device']} layer-times idle per device: "
        f"bubble {data['idle_fraction']:.0%} of the step", fontsize=9, loc="left")


def _pipeline_figure(schedules: dict[str, dict[str, Any]]) -> Figure:
    fig = Figure(figsize=(10, 5.6), layout="constrained")
    axes = fig.subplots(len(schedules), 1)
    span = max(d["step_layer_time"] for d in schedules.values())
    for ax, (name, data) in zip(axes, schedules.items()):
        _draw_schedule(ax, name, data, span)
    colours = _micro_batch_colours()
    handles = [Patch(facecolor=c, label=f"micro-batch {m}") for m, c in enumerate(colours)]
    handles += [Patch(facecolor="0.6", alpha=0.55, hatch="///", edgecolor="white",
                      label="second pass round the ring"),
                Patch(facecolor="white", edgecolor="0.6", linestyle=":",
                      label="idle (bubble)")]
    fig.legend(handles=handles, loc="outside lower center", ncol=5, fontsize=8,
               frameon=False)
    fig.suptitle(
        f"Pipeline schedules as cerebrax.wse.recording_schedule() records them: {LAYERS} "
        f"identical layers, {STAGES} stage devices, {MICRO_BATCHES} micro-batches\n"
        "forward pass (the backward pass runs the same ticks in reverse); "
        "cell: micro-batch m on virtual stage k", fontsize=10)
    return fig


def _memory_figure(memory: dict[str, dict[str, Any]]) -> Figure:
    fig = Figure(figsize=(10, 5), layout="constrained")
    ax = fig.subplots()
    modes = list(memory)
    reports = {mode: memory[mode]["report"] for mode in modes}
    # A category every report gives as 0 (or not at all) is left out of the chart.
    shown = [c for c in MEMORY_CATEGORIES if any(r[c[0]] for r in reports.values())]
    bar = 0.38
    x = np.arange(len(shown))
    colours = {"replica": "#4c72b0", "weight_streaming": "#dd8452"}
    base = [(reports[modes[0]][field] or 0) / 1024 for field, _, _ in shown]
    for i, mode in enumerate(modes):
        values = [(reports[mode][field] or 0) / 1024 for field, _, _ in shown]
        offset = (i - (len(modes) - 1) / 2) * bar
        bars = ax.bar(x + offset, values, bar * 0.95, label=MODE_TITLES[mode],
                      color=colours.get(mode))
        labels = [f"{v:,.1f}" if i == 0 or not b else f"{v:,.1f}\n{v / b:.1%} of {modes[0]}"
                  for v, b in zip(values, base)]
        ax.bar_label(bars, labels, fontsize=7, padding=2)
    # The unsharded totals, the same in both modes: a dotted line across the pair.
    first = reports[modes[0]]
    totals = [(j, first[total_field] / 1024)
              for j, (_, _, total_field) in enumerate(shown) if total_field is not None]
    for n, (j, total) in enumerate(totals):
        ax.hlines(total, x[j] - bar, x[j] + bar, colors="0.2", linestyles=":",
                  linewidth=1.2, label=None if n else "unsharded total")
    ax.set_xticks(x, [label for _, label, _ in shown], fontsize=8)
    ax.set_ylabel("KiB per device")
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(loc="upper left", frameon=False, fontsize=8)
    params = first["params_total_bytes"] / 1024
    left_out = [label.split("\n")[0] for field, label, _ in MEMORY_CATEGORIES
                if not any(r[field] for r in reports.values())]
    note = f"; {', '.join(left_out)}: 0 bytes" if left_out else ""
    ax.set_title(
        f"Memory per device as cerebrax.wse.memory_report() gives it for the compiled "
        f"training step\n{LAYERS} layers of {WIDTH}x{WIDTH} ({params:,.0f} KiB of float32 "
        f"parameters), AdamW, batch {BATCH}, {DEVICES} devices{note}", fontsize=10)
    return fig


def _save(fig: Figure, path: pathlib.Path) -> None:
    """Writes ``fig`` as SVG (under :data:`SVG_RC`: text as text, fixed ids, no date)."""
    fig.savefig(path, format="svg", metadata=SVG_METADATA)


# ---- the entry points ------------------------------------------------------------------
def write_figures(out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Runs the steps, draws both figures into ``out_dir`` and returns the data drawn
    (also written as ``out_dir/wafer_figures.json``).

    Raises:
      RuntimeError: JAX started with fewer than 8 devices (run this file as a script).
    """
    if jax.device_count() < DEVICES:
        raise RuntimeError(
            f"the wafer figures need {DEVICES} emulated devices, JAX has "
            f"{jax.device_count()}: run `python docs/_ext/wafer_figures.py OUT_DIR` in "
            f"its own process, or set XLA_FLAGS={_DEVICE_FLAG}={DEVICES} before JAX starts")
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as logs:  # the runs' artifacts are not kept
        try:
            data = {
                "model": {"layers": LAYERS, "width": WIDTH, "batch": BATCH,
                          "devices": DEVICES, "layer_costs": layer_costs(),
                          "optimizer": "AdamW", "dtype": "float32"},
                "pipeline": {name: _schedule_data(name, logs) for name in PIPELINE_LAYOUTS},
                "memory": {mode: _memory_data(mode, logs) for mode in MEMORY_LAYOUTS},
            }
        finally:
            cstorch.reset()
    with matplotlib.rc_context(SVG_RC):  # while the figures are built and written
        _save(_pipeline_figure(data["pipeline"]), out / "pipeline_schedules.svg")
        _save(_memory_figure(data["memory"]), out / "weight_streaming_memory.svg")
    (out / "wafer_figures.json").write_text(json.dumps(data, indent=1) + "\n")
    return data


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python docs/_ext/wafer_figures.py OUT_DIR", file=sys.stderr)
        return 2
    write_figures(argv[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
