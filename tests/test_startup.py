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

import pytest

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


def run_python(code: str, directory: pathlib.Path, **env: str) -> dict:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=directory, env={**os.environ, **env}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_building_model_optimizer_and_schedulers_compiles_almost_nothing(tmp_path):
    pytest.importorskip("torch")  # the script trains a torch model
    # Eager JAX operations compile one small program per operation and shape, each 10 to
    # 100 ms: building state with them cost a gigaGPT-style script about 40 programs
    # (1.5 s) before its first step. State is now built on the host and copied over, the
    # optimizer's zero moments included. What is left is one program per scheduler
    # (three here, each evaluates its closed form once at construction) and one for the
    # compiled model's random key: none per parameter shape.
    out = run_python(SETUP, tmp_path, CEREBRAX_COMPILE_CACHE="0")
    assert out["compiles"] <= 4, out
    assert out["lr"] == [0.0, 0.0]


STEP_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np, torch
    import cerebrax as cstorch

    events = {"hits": 0, "misses": 0}
    def count(event, **kwargs):
        if event == "/jax/compilation_cache/cache_hits":
            events["hits"] += 1
        elif event == "/jax/compilation_cache/cache_misses":
            events["misses"] += 1
    jax.monitoring.register_event_listener(count)

    SCALE = float(sys.argv[1])  # changes the step's program, as an edited script would
    torch.manual_seed(0)
    backend = cstorch.backend("CPU")
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x, y):
        loss = torch.nn.functional.mse_loss(compiled(x), y) * SCALE
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    losses = []
    @cstorch.step_closure
    def record(loss):
        losses.append(float(loss.item()))

    rng = np.random.default_rng(0)
    for _ in range(3):
        record(step(torch.tensor(rng.normal(size=(8, 3)), dtype=torch.float32),
                    torch.tensor(rng.normal(size=(8, 1)), dtype=torch.float32)))
    print(json.dumps({**events, "losses": losses, "dir": backend.compile_cache_dir,
                      "exported": "torch_bridge._export" in sys.modules}))
""")


def run_step(directory: pathlib.Path, scale: float, **env: str) -> dict:
    # The default cache folder, under a home of the test's own.
    base = {k: v for k, v in os.environ.items()
            if k not in ("CEREBRAX_COMPILE_CACHE", "CEREBRAX_TORCH_CAPTURE")}
    base.update(JAX_PLATFORMS="cpu", XDG_CACHE_HOME=str(directory / "xdg"))
    result = subprocess.run([sys.executable, "-c", STEP_SCRIPT, str(scale)], cwd=directory,
                            capture_output=True, text=True, timeout=300,
                            env={**base, **env})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_second_run_loads_its_step_and_a_changed_step_is_compiled_again(tmp_path):
    pytest.importorskip("torch")  # the script trains a torch model
    # The model is exported (not traced directly), so the export cache is checked too.
    export = {"CEREBRAX_TORCH_CAPTURE": "export"}
    first = run_step(tmp_path, 1.0, **export)
    assert first["dir"] == str(tmp_path / "xdg" / "cerebrax" / "jax_cache")
    assert not (tmp_path / "cerebras_logs").exists()  # nothing written where it runs
    assert first["misses"] >= 1 and first["hits"] == 0
    second = run_step(tmp_path, 1.0, **export)
    # Every program of the second process, the step included, is loaded: none compiled;
    # the model's graph is loaded too: torch.export's machinery is not even imported.
    assert second["misses"] == 0 and second["hits"] >= 1, second
    assert second["losses"] == first["losses"]
    assert first["exported"] and not second["exported"]
    # An edited step is another program: compiled, never the stale one loaded. The
    # model is the same, and so is its graph.
    changed = run_step(tmp_path, 2.0, **export)
    uncached = run_step(tmp_path, 2.0, CEREBRAX_COMPILE_CACHE="0", **export)
    assert changed["misses"] >= 1, changed
    assert changed["losses"] == uncached["losses"] != first["losses"]
    assert uncached["dir"] is None and uncached["hits"] == uncached["misses"] == 0
    assert not changed["exported"] and uncached["exported"]


def test_a_directly_traced_model_exports_nothing_and_a_second_run_loads_its_step(tmp_path):
    pytest.importorskip("torch")  # the script trains a torch model
    first = run_step(tmp_path, 1.0)
    second = run_step(tmp_path, 1.0)
    assert not first["exported"] and not second["exported"]
    assert first["misses"] >= 1 and first["hits"] == 0
    assert second["misses"] == 0 and second["hits"] >= 1, second
    exported = run_step(tmp_path, 1.0, CEREBRAX_TORCH_CAPTURE="export",
                        CEREBRAX_COMPILE_CACHE="0")
    assert second["losses"] == first["losses"] == exported["losses"]


def test_the_switch_names_another_directory(tmp_path):
    pytest.importorskip("torch")  # the script trains a torch model
    out = run_step(tmp_path, 1.0, CEREBRAX_COMPILE_CACHE=str(tmp_path / "cache"))
    assert out["dir"] == str(tmp_path / "cache")
    assert any((tmp_path / "cache").iterdir())
    assert not (tmp_path / "xdg").exists()


def test_a_folder_that_cannot_be_made_leaves_the_cache_off_and_says_how_to_fix_it(
        tmp_path, monkeypatch):
    import jax
    import pytest

    from cerebrax.backend import _compile_cache

    run_cache = jax.config.jax_compilation_cache_dir  # the test run's own (conftest.py)
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("CEREBRAX_COMPILE_CACHE", str(tmp_path / "file" / "cache"))
    jax.config.update("jax_compilation_cache_dir", None)  # as in a user's process
    try:
        with pytest.warns(UserWarning, match=r"cannot create .*file/cache .*"
                          r"CEREBRAX_COMPILE_CACHE=/path .*CEREBRAX_COMPILE_CACHE=0"):
            assert _compile_cache.enable() is None
        assert not jax.config.jax_compilation_cache_dir
    finally:
        jax.config.update("jax_compilation_cache_dir", run_cache)
