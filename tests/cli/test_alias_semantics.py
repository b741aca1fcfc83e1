"""Where cstorch and cerebrax's own API differ, cstorch code under the alias gets cstorch's
behaviour (each in a fresh process: the alias stays on for the process):

- step closures run when the loop moves on to the next step, so they see the Python state
  of their own step (Model Zoo's Trainer names the step it logs from
  ``trainer.global_step``, read in the closure); without the alias they run one step
  later, so the device never waits for the host;
- every value of a step reaches a closure as a torch tensor (a param group's learning
  rate too, which Model Zoo's TensorBoard logger only writes as a tensor); without the
  alias, values that were not torch tensors arrive as numpy arrays.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch")  # the scripts are torch training loops

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = """
import json, sys
import torch
import cerebrax
if sys.argv[1] == "alias":
    cerebrax.enable_cstorch_alias()
    import cerebras.pytorch as cstorch
else:
    import cerebrax as cstorch

torch.manual_seed(0)
model = cstorch.compile(torch.nn.Linear(2, 1), "CPU")
optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
scheduler = cstorch.optim.lr_scheduler.LinearLR(
    optimizer, initial_learning_rate=0.1, end_learning_rate=0.0, total_iters=8)
state = {"global_step": 0}
seen = []


@cstorch.step_closure
def log(loss, lr):
    seen.append({"global_step": state["global_step"], "iteration": executor.iteration,
                 "loss": type(loss).__name__, "lr": type(lr).__name__,
                 "lr_value": float(lr)})


@cstorch.trace
def step(x):
    loss = model(x).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()
    log(loss, optimizer.param_groups[0]["lr"])
    return loss


loader = cstorch.utils.data.DataLoader(lambda: [torch.ones(1, 2)] * 5)
executor = cstorch.utils.data.DataExecutor(loader, num_steps=5, progress_bar=False)
for batch in executor:
    step(batch)
    state["global_step"] += 1
print(json.dumps(seen))
"""


def _run(tmp_path: pathlib.Path, mode: str) -> list[dict]:
    script = tmp_path / "closures.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(script), mode], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_under_the_alias_closures_see_their_own_steps_python_state(tmp_path):
    seen = _run(tmp_path, "alias")
    # the closure of 0-based step i runs after the loop's own code of step i (global_step
    # i + 1) and before step i + 1 starts (iteration i)
    assert [s["global_step"] for s in seen] == [1, 2, 3, 4, 5]
    assert [s["iteration"] for s in seen] == [0, 1, 2, 3, 4]
    assert {s["loss"] for s in seen} == {s["lr"] for s in seen} == {"Tensor"}
    assert [s["lr_value"] for s in seen] == pytest.approx(
        [0.1 * (1 - k / 8) for k in range(1, 6)])


def test_without_the_alias_closures_run_a_step_later_with_numpy_values(tmp_path):
    seen = _run(tmp_path, "plain")
    # the closures of steps 0..2 run as steps 2..4 begin (the state of one step later)
    assert [s["global_step"] for s in seen][:3] == [2, 3, 4]
    assert seen[0]["loss"] == "Tensor" and seen[0]["lr"] == "ndarray"
    assert [s["lr_value"] for s in seen] == pytest.approx(
        [0.1 * (1 - k / 8) for k in range(1, 6)])
