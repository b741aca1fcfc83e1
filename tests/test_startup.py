"""What a script pays before its first step: the programs XLA compiles while the model,
optimizer and schedulers are built (each eager JAX operation on a new shape is one), and
the compilation cache that lets a second run of the same script load its step instead of
compiling it. Each case runs in a fresh process: compiled programs are cached per
process, so a count taken after other tests would be too low."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

REPO = pathlib.Path(__file__).resolve().parent.parent

SETUP = textwrap.dedent("""
    import json, sys
    import jax, torch
    import cerebrax as cstorch

    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, secs, **kw: compiles.append(event)
        if event == "/jax/core/compile/backend_compile_duration" else None)

    class Net(torch.nn.Module):  # several parameter shapes, a tied pair, a buffer
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(50, 8)
            self.ln = torch.nn.LayerNorm(8)
            self.fc = torch.nn.Linear(8, 24)
            self.bn = torch.nn.BatchNorm1d(24)
            self.out = torch.nn.Linear(24, 50, bias=False)
            self.head = torch.nn.Linear(8, 50, bias=False)
            self.head.weight = self.emb.weight

    backend = cstorch.backend("CPU")
    with backend.device:
        model = Net()
    compiled = cstorch.compile(model, backend)
    params = list(model.parameters())
    optimizer = cstorch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=0.1, betas=(0.9, 0.95), correct_bias=True)
    scheduler = cstorch.optim.lr_scheduler.SequentialLR(optimizer, schedulers=[
        cstorch.optim.lr_scheduler.LinearLR(optimizer, initial_learning_rate=0.0,
                                            end_learning_rate=0.01, total_iters=2),
        cstorch.optim.lr_scheduler.CosineDecayLR(optimizer, initial_learning_rate=0.01,
                                                 end_learning_rate=0.001, total_iters=8),
    ], milestones=[2])
    print(json.dumps({"compiles": len(compiles), "lr": scheduler.get_last_lr()}))
""")


def run_python(code: str, **env: str) -> dict:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=REPO, env={**os.environ, **env}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_building_model_optimizer_and_schedulers_compiles_almost_nothing():
    # Eager JAX operations compile one small program per operation and shape, each 10 to
    # 100 ms: building state with them cost a gigaGPT-style script about 40 programs
    # (1.5 s) before its first step. State is now built on the host and copied over;
    # what is left is one program per scheduler (three here, each evaluates its closed
    # form once at construction), one for the optimizer's initial state and one for the
    # converted module's random key: none per parameter shape.
    out = run_python(SETUP)
    assert out["compiles"] <= 5, out
    assert out["lr"] == [0.0, 0.0]
