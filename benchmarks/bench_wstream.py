"""Weight streaming of a GPT-style torch model on 8 emulated devices: memory, compile
time and collectives of the compiled training step, by depth.

The model: an ``nn.ModuleList`` of ``blocks`` identical pre-norm transformer blocks
(width ``WIDTH``, ``HEADS`` heads, sequence ``SEQ``, a causal mask carried next to the
residual stream), token and position embeddings, a head tied to the token embedding;
AdamW; a batch of ``ROWS`` sequences (one per device). For 4, 8, 16 and 32 blocks the
script lowers and compiles one training step in ``ClusterConfig(execution_mode=
"weight_streaming", max_wgt_servers=8)`` and reports, per device, from XLA's compiled
memory analysis: arguments (parameter and AdamW shards, batch), temporaries, their sum
(the peak) and the bound ``total / 8 + 2 blocks + activations`` (total: parameters,
gradients and AdamW state; activations: an upper estimate of what one device holds);
the seconds of XLA's compile (``Lowered.compile``) and of lowering (torch export and
tracing); and the collectives of the compiled program (:func:`cstorch.wse.
collective_report`): all-gathers and reduce-scatters per iteration of the forward and
the backward loop over the blocks, with the trip count, those outside the loops, and
the non-trivial all-reduces.

Two comparisons at each depth (``--compare``): the same streaming with the blocks
unrolled instead of scanned, and the sharded layout of before (state split over
``"wgt"``, batch over ``"csx"``, XLA's SPMD partitioner picks the collectives). Both are
obtained by switching internals of ``cerebrax.wse`` off for the measurement.

    python benchmarks/bench_wstream.py              # prints the table
    python benchmarks/bench_wstream.py --compare    # also unrolled and sharded
    python benchmarks/bench_wstream.py --write      # and writes RESULTS.md's section

The script re-executes itself with ``XLA_FLAGS=--xla_force_host_platform_device_count=8``
when that flag is missing.
"""

from __future__ import annotations

import os
import sys

FLAG = "--xla_force_host_platform_device_count=8"
if FLAG not in os.environ.get("XLA_FLAGS", ""):  # XLA reads the flag once, at start-up
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + FLAG).strip()
    os.execv(sys.executable, [sys.executable, *sys.argv])

import argparse  # noqa: E402
import contextlib  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from results import write_section  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "multidevice"))
from gpt_model import gpt  # noqa: E402

import cerebrax as cstorch  # noqa: E402
from cerebrax.wse import _run, _streaming  # noqa: E402

VOCAB, SEQ, WIDTH, HEADS, ROWS = 64, 16, 128, 4, 8
DEPTHS = (4, 8, 16, 32)
SERVERS = 8
MiB = 2**20


def activation_bytes(blocks: int, rows: int) -> int:
    """Upper estimate of one device's activations (see tests/multidevice/
    test_weight_streaming.py): saved block inputs, one block's values, the logits."""
    carries = (blocks + 2) * SEQ * WIDTH
    inside = SEQ * 16 * WIDTH + 2 * HEADS * SEQ * SEQ
    return 4 * rows * (carries + inside + 3 * SEQ * VOCAB)


@contextlib.contextmanager
def variant(name: str):
    """``streamed`` (as built), ``unrolled`` (no scan) or ``sharded`` (no streaming)."""
    saved = _streaming._groups, _run.streamed_apply
    if name == "unrolled":
        _streaming._groups = lambda stages, keys, projection: saved[0](
            stages, [None] * len(keys), None)
    elif name == "sharded":
        _run.streamed_apply = lambda *args, **kwargs: None
    try:
        yield
    finally:
        _streaming._groups, _run.streamed_apply = saved


def measure(blocks: int, name: str = "streamed") -> dict:
    cstorch.reset()
    cstorch.amp.set_half_dtype("float32")
    backend = cstorch.backend("CSX", cluster_config=cstorch.distributed.ClusterConfig(
        execution_mode="weight_streaming", max_wgt_servers=SERVERS))
    net = gpt(blocks, vocab=VOCAB, seq=SEQ, width=WIDTH, heads=HEADS, seed=0)
    model = cstorch.compile(net, backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

    @cstorch.trace
    def training_step(x, y):
        logits = model(x)
        loss = optax.softmax_cross_entropy_with_integer_labels(
            logits.reshape(-1, VOCAB), y.reshape(-1)).mean()
        cstorch.backward(loss)
        optimizer.step()
        return loss

    x = np.zeros((ROWS, SEQ), np.int32)
    with variant(name):
        start = time.perf_counter()
        lowered = training_step.lower(x, x)
        lower_s = time.perf_counter() - start
        start = time.perf_counter()
        compiled = lowered.compile()
        compile_s = time.perf_counter() - start
    memory = cstorch.wse.report_for_compiled(training_step, compiled)
    report = cstorch.wse.parse_collectives(compiled.as_text())
    block = 4 * sum(p.numel() for p in net.blocks[0].parameters())
    total = 2 * memory.params_total_bytes + memory.optimizer_total_bytes
    bound = total / SERVERS + 2 * block + activation_bytes(blocks, ROWS // SERVERS)
    loops = sorted((loop for loop in report.loops if loop.count("all-gather")),
                   key=lambda loop: loop.count("reduce-scatter"))
    reduces = [c for c in report.outside if c.kind == "all-reduce" and not c.trivial]
    reduces += [c for loop in report.loops for c in loop.collectives
                if c.kind == "all-reduce" and not c.trivial]
    cstorch.reset()
    return dict(
        blocks=blocks, variant=name, params=memory.params_total_bytes, block=block,
        args=memory.xla_argument_bytes, temps=memory.temp_bytes,
        peak=memory.xla_argument_bytes + memory.temp_bytes, bound=bound,
        compile_s=compile_s, lower_s=lower_s, loops=loops, report=report,
        all_reduces=len(reduces),
        all_reduce_max=max((_bytes(c.shape) for c in reduces), default=0),
    )


def _bytes(shape: str) -> int:
    """Bytes of an HLO result shape (``"f32[64,128]{1,0}"``, tuples summed)."""
    sizes = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "pred": 1, "f64": 8}
    total = 0
    for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", shape):
        total += sizes.get(dtype, 4) * math.prod(int(d) for d in dims.split(",") if d)
    return total


def loop_text(row: dict) -> str:
    if not row["loops"]:
        return "no loop"
    parts = []
    for loop in row["loops"]:
        parts.append(f"{loop.count('all-gather')} AG + {loop.count('reduce-scatter')} RS"
                     f" x {loop.trip_count}")
    return " / ".join(parts)


def table(rows: list[dict]) -> str:
    head = ("| blocks | layout | params (MiB) | args / dev (MiB) | temps / dev (MiB) | "
            "peak / dev (MiB) | bound (MiB) | peak / bound | XLA compile (s) | "
            "lower (s) | block loops fwd / bwd (per iteration x trips) | "
            "outside loops AG, RS | all-reduces (largest) |")
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for r in rows:
        outside = f"{r['report'].count('all-gather')}, {r['report'].count('reduce-scatter')}"
        lines.append(
            f"| {r['blocks']} | {r['variant']} | {r['params'] / MiB:.2f} | "
            f"{r['args'] / MiB:.3f} | {r['temps'] / MiB:.3f} | {r['peak'] / MiB:.3f} | "
            f"{r['bound'] / MiB:.3f} | {r['peak'] / r['bound']:.2f} | {r['compile_s']:.1f} | "
            f"{r['lower_s']:.1f} | {loop_text(r)} | {outside} | "
            f"{r['all_reduces']} ({r['all_reduce_max']} B) |")
    return "\n".join(lines)


def growth(rows: list[dict]) -> str:
    streamed = [r for r in rows if r["variant"] == "streamed"]
    shard = 4 * streamed[0]["block"] / SERVERS
    lines = [f"One block's parameters + gradients + AdamW moments over {SERVERS} devices: "
             f"{shard / 1024:.1f} KiB."]
    for lo, hi in zip(streamed, streamed[1:]):
        per = (hi["peak"] - lo["peak"]) / (hi["blocks"] - lo["blocks"])
        lines.append(f"- {lo['blocks']} -> {hi['blocks']} blocks: peak grows "
                     f"{per / 1024:.1f} KiB per block ({per / shard:.2f} x that shard); "
                     f"XLA compile {hi['compile_s'] / lo['compile_s']:.2f} x for "
                     f"{hi['blocks'] / lo['blocks']:.0f} x the blocks")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compare", action="store_true",
                        help="also measure the unrolled and the sharded layout")
    parser.add_argument("--write", action="store_true", help="update RESULTS.md")
    parser.add_argument("--depths", type=int, nargs="*", default=list(DEPTHS))
    args = parser.parse_args()
    variants = ["streamed"] + (["unrolled", "sharded"] if args.compare else [])
    rows = []
    for blocks in args.depths:
        for name in variants:
            rows.append(measure(blocks, name))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    text = (
        f"## Weight streaming by depth (bench_wstream.py)\n\n"
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"{jax.device_count()} emulated CPU devices, JAX {jax.__version__}, load average "
        f"{load:.1f}. GPT: width {WIDTH}, {HEADS} heads, sequence {SEQ}, vocabulary "
        f"{VOCAB}, batch {ROWS}, AdamW, float32; max_wgt_servers={SERVERS}.\n\n"
        + table(rows) + "\n\n" + growth(rows) + "\n"
    )
    print()
    print(text)
    if args.write:
        write_section(pathlib.Path(__file__).with_name("RESULTS.md"), "wstream", text)


if __name__ == "__main__":
    main()
