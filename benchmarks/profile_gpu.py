"""Where a GPU step's time goes: the hand-written JAX step against cerebrax, kernel by kernel.

Builds ``bench_gpu.py``'s GPT-2 (the same module, data and AdamW) for the systems named,
times ``--steps`` steps of each after two untimed ones, then traces three more steps with
JAX's profiler and sums the device's kernel time by kernel name. One JSON file holds it
all; with ``--trace-dir`` the profiler's Perfetto traces stay there too. What XLA made of
each step (its GEMMs, cuDNN's fused attention, the fusions) is in the programs that
``XLA_FLAGS=--xla_dump_to=DIR`` writes; ``--programs DIR`` counts their custom calls and
fusions.

    python benchmarks/profile_gpu.py --batch 16 --out profile.json       # on a GPU
    python benchmarks/profile_gpu.py --tiny --out /tmp/profile.json      # CPU smoke run
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gzip
import json
import pathlib
import re
import sys
import tempfile
import time
import traceback

import jax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_gpu  # noqa: E402  (the model, the data, the systems)

SYSTEMS = {"jax": bench_gpu.JaxOptax, "cerebrax": bench_gpu.Cerebrax}
_CUSTOM_CALL = re.compile(r'custom_call_target="([^"]+)"')
_FUSION = re.compile(r"\bkind=(k\w+)")


def kernel_times(trace_dir: pathlib.Path) -> tuple[dict[str, float], dict[str, float]]:
    """Microseconds per kernel name on the GPU's streams, summed over a Perfetto trace,
    and microseconds per line of the GPU's process (streams, XLA ops, modules)."""
    paths = sorted(trace_dir.rglob("perfetto_trace.json.gz"))
    if not paths:
        return {}, {}
    events = json.loads(gzip.decompress(paths[-1].read_bytes()))
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    meta = [e for e in events if e.get("ph") == "M"]
    device_pids = {e["pid"] for e in meta if e.get("name") == "process_name"
                   and "GPU" in str(e.get("args", {}).get("name", ""))}
    lines = {(e["pid"], e.get("tid")): str(e.get("args", {}).get("name", ""))
             for e in meta if e.get("name") == "thread_name" and e["pid"] in device_pids}
    kernels: dict[str, float] = collections.Counter()
    per_line: dict[str, float] = collections.Counter()
    for e in events:
        if e.get("ph") != "X" or e.get("pid") not in device_pids:
            continue
        line = lines.get((e["pid"], e.get("tid")), "?")
        per_line[line] += float(e.get("dur", 0.0))
        if "stream" in line.lower():
            kernels[e.get("name", "?")] += float(e.get("dur", 0.0))
    return dict(kernels), dict(per_line)


def program_counts(text: str) -> dict[str, dict[str, int]]:
    return {"custom_calls": dict(collections.Counter(_CUSTOM_CALL.findall(text))),
            "fusions": dict(collections.Counter(_FUSION.findall(text)))}


def profile(run: bench_gpu.Run, system: str, precision: str, batch: int, steps: int,
            trace_root: pathlib.Path) -> dict:
    start = time.perf_counter()
    state = SYSTEMS[system](run, batch, precision)
    state.read(state.step(0))
    first = time.perf_counter() - start
    state.read(state.step(1))
    start = time.perf_counter()
    for i in range(2, 2 + steps):
        loss = state.step(i)
    state.read(loss)
    step_s = (time.perf_counter() - start) / steps
    trace_dir = trace_root / f"{system}_{precision}"
    kernels: dict[str, float] = {}
    per_line: dict[str, float] = {}
    try:
        with jax.profiler.trace(str(trace_dir), create_perfetto_trace=True):
            for i in range(3):
                loss = state.step(i)
            state.read(loss)
        kernels, per_line = kernel_times(trace_dir)
    except Exception as e:  # noqa: BLE001 - a profiler that cannot start is a note
        print(f"{system}: profiler: {bench_gpu._first_line(e)}")
    top = sorted(kernels.items(), key=lambda kv: -kv[1])
    total = sum(kernels.values()) or 1.0
    print(f"{system}, {precision}, batch {batch}: {1 / step_s:.3g} steps/s, first step "
          f"{first:.1f} s; kernel time per step {total / 3e3:.2f} ms")
    for name, us in top[:25]:
        print(f"  {us / 3e3:8.3f} ms  {us / total:6.1%}  {name[:110]}")
    print("  lines (ms per step): " + ", ".join(f"{k}: {v / 3e3:.2f}"
                                              for k, v in per_line.items()))
    return {"system": system, "precision": precision, "batch": batch,
            "steps_per_s": 1 / step_s, "first_step_s": first, "note": state.note,
            "kernel_ms_per_step": {k: v / 3e3 for k, v in top},
            "line_ms_per_step": {k: v / 3e3 for k, v in per_line.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="the CI-sized model")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--systems", default="jax,cerebrax")
    parser.add_argument("--precisions", default="bf16")
    parser.add_argument("--trace-dir", help="keep the Perfetto traces here")
    parser.add_argument("--programs", help="count the programs XLA dumped here, and stop")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.programs:
        counts = {path.name: program_counts(path.read_text()) for path in sorted(
            pathlib.Path(args.programs).glob("*after_optimizations.txt"))
            if path.stat().st_size > 100_000}
        pathlib.Path(args.out).write_text(json.dumps(counts, indent=1))
        print(json.dumps(counts, indent=1))
        return 0
    size = bench_gpu.TINY if args.tiny else bench_gpu.FULL
    run = bench_gpu.build_run(dataclasses.replace(size, batch=args.batch), args.batch)
    trace_root = pathlib.Path(args.trace_dir or tempfile.mkdtemp(prefix="profile_gpu_"))
    print(f"device: {bench_gpu.device_name(run)}")
    rows = []
    for precision in args.precisions.split(","):
        for system in args.systems.split(","):
            try:
                rows.append(profile(run, system, precision, args.batch, args.steps,
                                    trace_root))
            except Exception as e:  # noqa: BLE001 - the other systems still run
                traceback.print_exc()
                rows.append({"system": system, "precision": precision,
                             "skipped": bench_gpu._first_line(e)})
            bench_gpu._free(run)
    pathlib.Path(args.out).write_text(json.dumps(
        {"device": bench_gpu.device_name(run), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
