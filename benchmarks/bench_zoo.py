"""Time to the first training step and peak host memory of the model zoo.

Every case of ``tests/torch_bridge/real_models.py`` (Hugging Face, timm and torchvision
models at toy sizes), in train and in eval mode, one training step (forward, gradient
of the objective, one optimizer update):

- cerebrax: ``torch_bridge.convert`` + ``jax.jit`` of the step, from the built torch
  model to the first step's results on the host (export, tracing, XLA compile, run);
- torch: ``torch.compile`` of the same model, the same inputs and objective, backward
  and a torch.optim step, from the built model to the end of that step.

Each measurement runs in a fresh subprocess (compilers cold, torch inductor's cache in
a new directory), so one model's compile caches never serve another's. Peak memory is
the process's ``ru_maxrss`` after the first step minus its value after the imports.

Targets: time to first step <= 1.5x torch.compile's; peak <= 4x parameter bytes + 1 GB.

    nice python benchmarks/bench_zoo.py               # every case, both modes
    python benchmarks/bench_zoo.py --cases gpt2,resnet18 --modes train --no-write
    python benchmarks/bench_zoo.py --cases efficientnet_b0 --modes train --redo

A full run takes hours on a small machine (torch.compile builds C++ for every model), so
each finished row is kept in ``benchmarks/zoo_rows.json`` with the load average it ran
under; a later run skips the rows already measured (``--fresh`` measures everything
again) and the table in RESULTS.md is written from all kept rows.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "torch_bridge"))

TIME_TARGET = 1.5
GB = 1 << 30
ROWS = ROOT / "benchmarks" / "zoo_rows.json"


def _peak_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _imports() -> None:
    """Everything both sides import before the clock starts."""
    import jax  # noqa: F401
    import torch._dynamo  # noqa: F401
    import torch.export  # noqa: F401
    import real_models  # noqa: F401
    import vision

    vision.load()
    import transformers  # noqa: F401


def child(side: str, name: str, mode: str) -> dict:
    """One measurement, in this (fresh) process."""
    _imports()
    import real_models
    import torch

    case = real_models.CASES[name]
    train = mode == "train"
    baseline = _peak_bytes()
    model = case.build().train(train)
    params = sum(p.numel() for p in model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    result = dict(side=side, name=name, mode=mode, params=params, param_bytes=param_bytes)
    start = time.perf_counter()
    try:
        if side == "cerebrax":
            run, _ = real_models.jax_step(case, model, train=train)
            run()  # export, trace, compile, one step; results fetched to the host
        else:
            _torch_compile_step(case, model, torch)
    except Exception as e:  # reported in the table, not raised
        result["error"] = type(e).__name__
        result["message"] = str(e).splitlines()[0][:300] if str(e) else ""
    result["seconds"] = time.perf_counter() - start
    result["peak_bytes"] = _peak_bytes() - baseline
    return result


def _torch_compile_step(case, model, torch) -> None:
    import real_models

    compiled = torch.compile(model)
    args, kwargs = case.inputs()
    optimizer = real_models.torch_optimizer(model)
    optimizer.zero_grad()
    out = compiled(*args, **kwargs)
    real_models.torch_objective(case, out).backward()
    optimizer.step()


def measure(side: str, name: str, mode: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, PYTHONWARNINGS="ignore")
        cmd = [sys.executable, __file__, "--child", side, name, mode]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                                  timeout=timeout, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return dict(side=side, name=name, mode=mode, error="Timeout")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return dict(side=side, name=name, mode=mode, error=f"exit {proc.returncode}",
                    message=tail[:300])
    return json.loads(lines[-1])


def row(ours: dict, theirs: dict) -> dict:
    params = ours.get("params") or theirs.get("params") or 0
    param_bytes = ours.get("param_bytes") or theirs.get("param_bytes") or 0
    budget = 4 * param_bytes + GB
    r = dict(model=ours["name"], mode=ours["mode"], params=params)
    r["ours_s"] = None if "error" in ours else ours["seconds"]
    r["ours_error"] = ours.get("error")
    r["ours_mb"] = ours.get("peak_bytes", 0) / 2**20
    r["torch_s"] = None if "error" in theirs else theirs["seconds"]
    r["torch_error"] = theirs.get("error")
    r["torch_mb"] = theirs.get("peak_bytes", 0) / 2**20
    r["ratio"] = (r["ours_s"] / r["torch_s"]) if r["ours_s"] and r["torch_s"] else None
    r["mem_ok"] = ours.get("peak_bytes", float("inf")) <= budget
    r["budget_mb"] = budget / 2**20
    r["messages"] = [f"{side['side']} {side['name']} ({side['mode']}): {side['error']}: "
                     f"{side.get('message', '')}" for side in (ours, theirs) if "error" in side]
    return r


def table(rows: list[dict]) -> str:
    head = ("| model | mode | parameters | cerebrax convert+compile to first step (s) "
            "| peak MB (cerebrax) | torch.compile to first step (s) | peak MB (torch) "
            "| ratio | time <= 1.5x | memory <= 4x params + 1 GB | load |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|\n")
    lines = []
    for r in rows:
        ours = f"{r['ours_s']:.1f}" if r["ours_s"] is not None else r["ours_error"]
        theirs = f"{r['torch_s']:.1f}" if r["torch_s"] is not None else r["torch_error"]
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        time_ok = "-" if r["ratio"] is None else ("yes" if r["ratio"] <= TIME_TARGET else "no")
        mem = f"{'yes' if r['mem_ok'] else 'no'} (of {r['budget_mb']:.0f})"
        lines.append(f"| {r['model']} | {r['mode']} | {r['params']:,} | {ours} "
                     f"| {r['ours_mb']:.0f} | {theirs} | {r['torch_mb']:.0f} | {ratio} "
                     f"| {time_ok} | {mem} | {r.get('load', 0):.1f} |")
    return head + "\n".join(lines) + "\n"


def machine() -> str:
    import jax
    import torch

    return (f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}, "
            f"jax {jax.__version__}, torch {torch.__version__}, "
            f"load average at the start {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=3, metavar=("SIDE", "CASE", "MODE"))
    parser.add_argument("--cases", default="")
    parser.add_argument("--modes", default="train,eval")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--fresh", action="store_true", help="forget the kept rows")
    parser.add_argument("--redo", action="store_true",
                        help="measure the --cases again, replacing their kept rows")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)), flush=True)
        return
    import real_models

    names = args.cases.split(",") if args.cases else list(real_models.CASES)
    header = machine()
    print(header, flush=True)
    kept = {} if args.fresh or args.no_write or not ROWS.exists() else {
        (r["model"], r["mode"]): r for r in json.loads(ROWS.read_text())}
    if args.redo:
        kept = {k: r for k, r in kept.items() if k[0] not in names}
    rows = []
    for name in names:
        for mode in args.modes.split(","):
            if (name, mode) in kept:
                continue
            load = os.getloadavg()[0]
            ours = measure("cerebrax", name, mode, args.timeout)
            theirs = measure("torch", name, mode, args.timeout)
            rows.append(dict(row(ours, theirs), load=load))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
            if not args.no_write:  # after every row: a long run that is cut keeps its rows
                kept[name, mode] = rows[-1]
                ROWS.write_text(json.dumps(list(kept.values()), indent=1) + "\n")
                from results import write_section

                order = {(n, m): i for i, (n, m) in enumerate(
                    (n, m) for n in real_models.CASES for m in ("train", "eval"))}
                everything = sorted(kept.values(),
                                    key=lambda r: order.get((r["model"], r["mode"]), 1 << 30))
                write_section(ROOT / "benchmarks" / "RESULTS.md", "zoo",
                              report(header, everything))
    print(table(rows))
    print("\n".join(m for r in rows for m in r["messages"]))


def report(header: str, rows: list[dict]) -> str:
    ratios = sorted(r["ratio"] for r in rows if r["ratio"] is not None)
    met = sum(r <= TIME_TARGET for r in ratios)
    mem = sum(r["mem_ok"] for r in rows)
    summary = (f"Time target met in {met} of {len(ratios)} comparable rows"
               + (f" (ratio median {ratios[len(ratios) // 2]:.2f}, range "
                  f"{ratios[0]:.2f} - {ratios[-1]:.2f})" if ratios else "")
               + f"; memory target met in {mem} of {len(rows)}.")
    messages = [m for r in rows for m in r.get("messages", [])]
    errors = ("\n\nErrors:\n\n" + "\n".join(f"- {m}" for m in messages)) if messages else ""
    return (f"## Model zoo: time to first step and peak memory (`bench_zoo.py`)\n\n"
            f"Machine: {header.split(', load average')[0]}. The load column is the "
            f"machine's load average when the row's measurement started.\n\n"
            f"{table(rows)}\n{summary}{errors}\n")


if __name__ == "__main__":
    main()
