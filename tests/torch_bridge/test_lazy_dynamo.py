"""torch's Dynamo-disabled Python kernels (``torch._refs`` meta kernels and the like) run
inside a traced step without importing ``torch._dynamo``, and hand over to torch's own
disabled functions once it is imported (torch_bridge/_lazy_dynamo.py). Each case runs in
a fresh process: this test process has imported ``torch._dynamo`` long ago."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

KERNELS = textwrap.dedent("""
    import json, sys
    import torch
    from torch_bridge import _lazy_dynamo

    _lazy_dynamo.defer()
    x = torch.randn(4, 5, device="meta")
    before = torch.linalg.vector_norm(x, 2.0, dim=1)
    out = {"shape": list(before.shape), "dtype": str(before.dtype),
           "imported": "torch._dynamo" in sys.modules}
    kernel = torch._refs.linalg.vector_norm  # pow, sum, sqrt: marked kernels underneath
    import torch._dynamo
    after = torch.linalg.vector_norm(x, 2.0, dim=1)
    # The kernels called since then carry torch's own disabled function again.
    import gc
    marked = [f for f in gc.get_objects() if type(f).__name__ == "function"
              and "__dynamo_disable" in vars(f)]
    out["torch_disabled"] = sum(
        1 for f in marked if getattr(vars(f)["__dynamo_disable"], "_torchdynamo_disable", 0))
    out["stand_ins"] = sum(
        1 for f in marked
        if type(vars(f)["__dynamo_disable"]) is _lazy_dynamo._UntilDynamo)
    out["after"] = [list(after.shape), str(after.dtype)]
    print(json.dumps(out))
""")

STEP = textwrap.dedent("""
    import json, sys
    if sys.argv[1] == "dynamo-first":
        import torch._dynamo
    import numpy as np, torch
    import cerebrax as cstorch

    torch.manual_seed(0)
    backend = cstorch.backend("CPU")
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=0.05)
    params = list(model.parameters())

    @cstorch.trace
    def step(x, y):
        loss = torch.nn.functional.cross_entropy(compiled(x), y, label_smoothing=0.1)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, 0.5)  # linalg.vector_norm's ref
        optimizer.step()
        optimizer.zero_grad()
        return loss, norm, torch.special.logit(torch.sigmoid(loss), eps=1e-6)

    losses = []
    @cstorch.step_closure
    def record(loss, norm, logit):
        losses.append([float(loss.item()), float(norm.item()), float(logit.item())])

    rng = np.random.default_rng(0)
    for _ in range(3):
        record(*step(torch.tensor(rng.normal(size=(8, 3)), dtype=torch.float32),
                     torch.tensor(rng.integers(0, 2, size=8))))
    print(json.dumps({"losses": losses, "imported": "torch._dynamo" in sys.modules}))
""")


def run(code: str, directory: pathlib.Path, *args: str, capture: str = "auto") -> dict:
    env = {k: v for k, v in os.environ.items() if k != "CEREBRAX_COMPILE_CACHE"}
    env.update(JAX_PLATFORMS="cpu", XDG_CACHE_HOME=str(directory / "xdg"),
               CEREBRAX_TORCH_CAPTURE=capture)
    result = subprocess.run([sys.executable, "-c", code, *args], cwd=directory, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_meta_kernels_run_without_dynamo_and_hand_over_once_it_is_imported(tmp_path):
    out = run(KERNELS, tmp_path)
    assert out["shape"] == [4] and out["dtype"] == "torch.float32"
    assert not out["imported"]
    assert out["after"] == [[4], "torch.float32"]
    # The kernels the second call ran were given torch's disabled functions; the others
    # keep their stand-ins until their own first call.
    assert out["torch_disabled"] >= 2 and out["stand_ins"] >= 50, out


def test_a_traced_step_with_clipping_trains_the_same_without_importing_dynamo(tmp_path):
    direct = run(STEP, tmp_path, "plain")  # the model traced directly: no torch.export
    # Exported (torch.export imports Dynamo), then the graph from the export cache.
    first = run(STEP, tmp_path, "plain", capture="export")
    warm = run(STEP, tmp_path, "plain", capture="export")
    reference = run(STEP, tmp_path, "dynamo-first")  # torch's own disabled kernels
    assert first["imported"] and reference["imported"]
    assert not warm["imported"] and not direct["imported"]
    assert warm["losses"] == first["losses"] == reference["losses"] == direct["losses"]
