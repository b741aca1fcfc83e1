"""Time to the first step of a gigaGPT-style script: cerebrax (cold and warm compile cache)
against the same training in torch eager, each in a fresh process, by phase.

The scripts are in ``benchmarks/startup/``: ``train_cstorch.py`` is written the way
gigaGPT's ``train.py`` is (``import cerebras.pytorch as cstorch``, the model built under
``backend.device``, ``cstorch.compile``, AdamW in two groups with a LinearLR warmup and a
cosine decay, a traced step with gradient clipping, a step closure, a torch DataLoader
with two persistent workers behind ``cstorch.utils.data.DataLoader`` and a
``DataExecutor``) and runs under ``cerebrax run``; ``train_eager.py`` trains the same
model (``gpt.py``: GPT-2 vocabulary, width 64, 2 blocks, sequence 32, batch 4) on the
same batches with torch's AdamW and the same schedule. Both print phase marks: seconds
from the benchmark's launch of the process to

- ``imports``: the script's imports done (Python, torch; cerebrax and JAX for cerebrax);
- ``model``: model, optimizer and schedule built (and compiled by ``cstorch.compile``);
- ``first_batch``: the first batch in hand (the DataLoader's workers started);
- ``first_step``: the first step's loss read (cerebrax: trace, export, XLA compile or
  cache load, run).

A cold cerebrax run starts with an empty compilation cache, the warm run after it uses
the cache the cold run filled (``CEREBRAX_COMPILE_CACHE`` names the directory). Rounds
alternate eager, cold, warm, with a pause of ``SETTLE`` seconds before each run so that
one run's exit does not overlap the next one's start; the medians are reported. Every
run's 20 losses are compared with eager's, so the three do the same training.

    python benchmarks/bench_startup.py                  # table; writes RESULTS.md
    python benchmarks/bench_startup.py --call module    # the step calls the torch module
    python benchmarks/bench_startup.py --repo OTHER     # cerebrax of another checkout
                                                        # (``git worktree``), e.g. before
                                                        # a change, for a "before" table
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

from results import write_section

HERE = pathlib.Path(__file__).resolve().parent
SCRIPTS = HERE / "startup"
PHASES = ("imports", "model", "first_batch", "first_step")
SETTLE = 2.0  # seconds between runs
LABELS = {"imports": "imports", "model": "model, optimizer, schedule built",
          "first_batch": "DataLoader workers until the first batch",
          "first_step": "first step (cerebrax: export, trace, compile or cache load)"}


def run(kind: str, tokens: pathlib.Path, cache: pathlib.Path, repo: pathlib.Path,
        call: str = "compiled") -> dict:
    """One fresh process: ``{"marks": {phase: s from launch}, "losses": [...]}``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SCRIPTS), str(repo), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    if kind == "eager":
        command = [sys.executable, str(SCRIPTS / "train_eager.py"), str(tokens)]
    else:
        command = [sys.executable, "-m", "cerebrax", "run", str(SCRIPTS / "train_cstorch.py"),
                   str(tokens), call]
        env["CEREBRAX_COMPILE_CACHE"] = str(cache)
    env["STARTUP_T0"] = repr(time.time())
    result = subprocess.run(command, cwd=cache.parent, env=env, capture_output=True,
                            text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    marks, losses = {}, []
    for line in result.stdout.splitlines():
        words = line.split()
        if words[:1] == ["phase"]:
            marks[words[1]] = float(words[2])
        elif words[:1] == ["step"]:
            losses.append(float(words[3]))
    return {"marks": marks, "losses": losses}


def durations(marks: dict) -> dict:
    """Each phase's own seconds, and ``total``: launch to the first step."""
    out, previous = {}, 0.0
    for phase in PHASES:
        out[phase] = marks[phase] - previous
        previous = marks[phase]
    out["total"] = marks["first_step"]
    out["rest"] = marks["done"] - marks["first_step"]
    return out


def measure(rounds: int, repo: pathlib.Path, call: str = "compiled") -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {"eager": [], "cold": [], "warm": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        sys.path.insert(0, str(SCRIPTS))
        from gpt import write_tokens

        tokens = tmp / "tokens.bin"
        write_tokens(tokens)
        for i in range(rounds):
            work = tmp / f"round_{i}"
            work.mkdir()
            cache = work / "jax_cache"
            for kind in ("eager", "cold", "warm"):
                # The last run's leftovers (its worker server and resource tracker exit
                # after it, unmapping gigabytes) would take CPU from this one's start.
                time.sleep(SETTLE)
                out = run(kind, tokens, cache, repo, call)
                runs[kind].append(out)
                d = durations(out["marks"])
                print(f"round {i + 1} {kind:5s}: " + ", ".join(
                    f"{p} {d[p]:.2f}" for p in (*PHASES, "total")) + " s", flush=True)
    return runs


def median(runs: list[dict], key: str) -> float:
    return statistics.median(durations(r["marks"])[key] for r in runs)


def loss_gap(runs: dict[str, list[dict]]) -> float:
    """Largest relative difference of a cerebrax loss from eager's, over all runs."""
    reference = runs["eager"][0]["losses"]
    return max(abs(a - b) / abs(b) for kind in ("cold", "warm") for r in runs[kind]
               for a, b in zip(r["losses"], reference, strict=True))


def section(runs: dict[str, list[dict]], rounds: int, label: str, command: str = "") -> str:
    import jax
    import torch

    rows = ["| phase | torch eager | cerebrax, cold cache | cerebrax, warm cache |",
            "|---|---|---|---|"]
    for phase in PHASES:
        rows.append(f"| {LABELS[phase]} | " + " | ".join(
            f"{median(runs[k], phase):.2f} s" for k in ("eager", "cold", "warm")) + " |")
    totals = {k: median(runs[k], "total") for k in runs}
    rows.append("| **launch to first step** | " + " | ".join(
        f"**{totals[k]:.2f} s**" for k in ("eager", "cold", "warm")) + " |")
    rows.append("| the other 19 steps | " + " | ".join(
        f"{median(runs[k], 'rest'):.2f} s" for k in ("eager", "cold", "warm")) + " |")
    ratio = {k: totals[k] / totals["eager"] for k in ("cold", "warm")}
    return "\n".join([
        f"## Time to the first step of a gigaGPT-style script ({label})",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores; jax {jax.__version__}, "
        f"torch {torch.__version__}, Python {platform.python_version()}. Each run is a "
        f"fresh process; {rounds} rounds of eager, cold, warm; medians. Command: "
        f"`python benchmarks/bench_startup.py{command}` (see its docstring for the "
        "scripts).",
        "",
        *rows,
        "",
        f"Launch to first step against torch eager: cold {ratio['cold']:.2f}x (target "
        f"<= 2.2x), warm {ratio['warm']:.2f}x (target <= 1.5x). The 20 losses of every "
        f"cerebrax run equal eager's within a relative {loss_gap(runs):.1e}.",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repo", default=str(HERE.parent),
                        help="the checkout whose cerebrax runs (default: this one)")
    parser.add_argument("--name", default="startup",
                        help="the RESULTS.md section to write (e.g. startup_before)")
    parser.add_argument("--label", default="after")
    parser.add_argument("--call", choices=("compiled", "module"), default="compiled",
                        help="what the cstorch script's step calls: the compiled model "
                        "(as gigaGPT does), or the torch module itself")
    parser.add_argument("--output", default=str(HERE / "RESULTS.md"))
    args = parser.parse_args()
    runs = measure(args.rounds, pathlib.Path(args.repo).resolve(), args.call)
    text = section(runs, args.rounds, args.label,
                   "".join(f" {shlex.quote(a)}" for a in sys.argv[1:] if a != args.output))
    print(text)
    write_section(pathlib.Path(args.output), args.name, text)


if __name__ == "__main__":
    main()
