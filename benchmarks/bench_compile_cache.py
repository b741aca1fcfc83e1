"""Time to first step with JAX's persistent compilation cache: cold vs warm.

Each run is a fresh process: `python -m cerebrax fit configs/digits_mlp.yaml` for one
step. A cold run starts with an empty ``compile_dir``; the warm run that follows uses the
directory the cold run filled, so XLA loads the step's executable instead of compiling it.
Two times are taken per run:

- first step: measured by the command itself, from the first call of the traced step to
  its result (trace, compile or cache load, run); printed as ``first step in X s``;
- process: from launching the process to that line (Python and JAX start-up, data,
  model initialization included).

    python benchmarks/bench_compile_cache.py     # prints the table, updates RESULTS.md

Rounds alternate cold and warm runs and the medians are reported. The table replaces the
section between ``<!-- cache:start -->`` and ``<!-- cache:end -->`` in RESULTS.md (or is
appended); the rest of the file is left as it is.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

import jax

REPO = pathlib.Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "digits_mlp.yaml"
START, END = "<!-- cache:start -->", "<!-- cache:end -->"
FIRST_STEP = re.compile(r"first step in ([\d.]+) s \(compile cache ([\w ]+):")


def run_once(compile_dir: pathlib.Path, model_dir: pathlib.Path) -> tuple[float, float, str]:
    """``(first step s, process start to first step s, cache state)`` of one fresh process."""
    command = [
        sys.executable, "-m", "cerebrax", "fit", str(CONFIG), "--model_dir", str(model_dir),
        "runconfig.num_steps=1", "runconfig.checkpoint_steps=0",
        f"runconfig.compile_dir={compile_dir}",
    ]  # fmt: skip
    started = time.perf_counter()
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    found = None
    for line in process.stdout:
        match = FIRST_STEP.search(line)
        if match and found is None:
            found = (float(match.group(1)), time.perf_counter() - started, match.group(2))
    _, stderr = process.communicate()
    if process.returncode != 0 or found is None:
        raise RuntimeError(f"`{' '.join(command)}` failed:\n{stderr[-3000:]}")
    return found


def measure(rounds: int) -> dict[str, list[tuple[float, float, str]]]:
    results: dict[str, list[tuple[float, float, str]]] = {"cold": [], "warm": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            compile_dir = pathlib.Path(tmp) / f"compile_{i}"
            for kind in ("cold", "warm"):
                result = run_once(compile_dir, pathlib.Path(tmp) / f"model_{i}_{kind}")
                results[kind].append(result)
                print(f"round {i + 1} {kind}: first step {result[0]:.3f} s, process "
                      f"{result[1]:.2f} s, cache {result[2]}", flush=True)  # fmt: skip
    return results


def section(results: dict, rounds: int) -> str:
    first = {k: statistics.median(r[0] for r in v) for k, v in results.items()}
    process = {k: statistics.median(r[1] for r in v) for k, v in results.items()}
    states = {k: sorted({r[2] for r in v}) for k, v in results.items()}
    machine = (
        f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}; "
        f"jax {jax.__version__}, backend {jax.default_backend()}"
    )
    return "\n".join([
        START,
        "## Time to first step: compile cache cold vs warm",
        "",
        f"Machine: {machine}. Job: `cerebrax fit configs/digits_mlp.yaml` (MLP on the "
        "digits, CSX backend, float16 compute, dynamic loss scaling), one step per fresh "
        f"process; {rounds} rounds of a cold run (empty `compile_dir`) followed by a warm "
        "run (the same `compile_dir`); medians. Command: "
        "`python benchmarks/bench_compile_cache.py`.",
        "",
        "| measurement | cold | warm | warm / cold | target |",
        "|---|---|---|---|---|",
        f"| first step (trace + compile or cache load + run) | {first['cold']:.3f} s | "
        f"{first['warm']:.3f} s | {first['warm'] / first['cold']:.3f} | <= 0.3 |",
        f"| process start to first step | {process['cold']:.2f} s | "
        f"{process['warm']:.2f} s | {process['warm'] / process['cold']:.3f} | (reference) |",
        "",
        f"Cache state reported by the runs: cold {', '.join(states['cold'])}; warm "
        f"{', '.join(states['warm'])}. The process time also counts Python and JAX start-up,",
        "loading the data and initializing the model, which no compile cache removes.",
        END,
    ])  # fmt: skip


def write_section(path: pathlib.Path, text: str) -> None:
    """Replaces the marked section of ``path`` with ``text``, or appends it."""
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    if START in old and END in old:
        head, rest = old.split(START, 1)
        new = head + text + rest.split(END, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(new)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", default=str(pathlib.Path(__file__).with_name("RESULTS.md")))
    args = parser.parse_args()
    text = section(measure(args.rounds), args.rounds)
    print(text)
    write_section(pathlib.Path(args.output), text)


if __name__ == "__main__":
    main()
