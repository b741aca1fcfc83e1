"""The garbage collector's thresholds held up from launch to the end of the first step
(cerebrax/_startup_gc.py): raised once, put back after the first traced step, and never
left raised in a forked process or over the script's own setting."""

from __future__ import annotations

import ast
import gc
import json
import os
import subprocess
import sys
import textwrap

import pytest

from cerebrax import _startup_gc
from cerebrax._runtime import RUNTIME


@pytest.fixture
def fresh(monkeypatch):
    """The hold as in a new process; the test process's thresholds afterwards."""
    before = gc.get_threshold()
    monkeypatch.setattr(RUNTIME, "startup_gc_used", False)
    monkeypatch.setattr(RUNTIME, "startup_gc_thresholds", None)
    monkeypatch.delenv("CEREBRAX_STARTUP_GC", raising=False)
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


def test_hold_raises_the_thresholds_once_and_release_puts_them_back(fresh):
    _startup_gc.hold()
    assert gc.get_threshold() == (10_000, 1_000, 1_000)
    gc.set_threshold(10_000, 1_000, 1_000)
    _startup_gc.release()
    assert gc.get_threshold() == (700, 10, 10)
    _startup_gc.hold()  # once per process: a later backend holds nothing
    assert gc.get_threshold() == (700, 10, 10)
    _startup_gc.release()
    assert gc.get_threshold() == (700, 10, 10)


def test_the_scripts_own_thresholds_win(fresh):
    gc.set_threshold(50_000, 20, 5)
    _startup_gc.hold()  # higher ones are kept
    assert gc.get_threshold() == (50_000, 1_000, 1_000)
    gc.set_threshold(300, 5, 5)  # the script sets its own while held
    _startup_gc.release()
    assert gc.get_threshold() == (300, 5, 5)


@pytest.mark.parametrize("how", ["switch", "off"])
def test_nothing_changes_when_switched_off_or_collection_is_off(fresh, monkeypatch, how):
    if how == "switch":
        monkeypatch.setenv("CEREBRAX_STARTUP_GC", "0")
        expected = (700, 10, 10)
    else:
        gc.set_threshold(0)
        expected = gc.get_threshold()
    _startup_gc.hold()
    assert gc.get_threshold() == expected
    _startup_gc.release()
    assert gc.get_threshold() == expected


FORK = textwrap.dedent("""
    import gc, json, os
    from cerebrax import _startup_gc  # no backend: JAX's runtime is not started

    gc.set_threshold(700, 10, 10)
    _startup_gc.hold()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave at once
        os.write(write, json.dumps(gc.get_threshold()).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = json.loads(pipe.read())
    os.waitpid(pid, 0)
    print(json.dumps({"child": child, "parent": gc.get_threshold()}))
""")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_a_process_forked_while_held_has_the_thresholds_as_before(tmp_path):
    # In a process of its own: this one runs JAX, and JAX warns of any fork.
    result = subprocess.run([sys.executable, "-c", FORK], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300,
                            env={**os.environ, "CEREBRAX_STARTUP_GC": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["child"] == [700, 10, 10]
    assert seen["parent"] == [10_000, 1_000, 1_000]  # this process: still held


SCRIPT = textwrap.dedent("""
    import gc, json, sys
    import torch
    import cerebrax as cstorch

    gc.set_threshold(700, 10, 10)
    seen = {"before": gc.get_threshold()}
    backend = cstorch.backend("CPU")
    seen["backend"] = gc.get_threshold()
    model = torch.nn.Linear(3, 1)
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x):
        loss = compiled(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    seen["built"] = gc.get_threshold()
    step(torch.ones(4, 3))
    seen["after"] = gc.get_threshold()
    print(json.dumps(seen))
""")


@pytest.mark.parametrize("launch", ["python", "cerebrax run"])
def test_a_script_holds_until_its_first_step(tmp_path, launch):
    pytest.importorskip("torch")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "CEREBRAX_COMPILE_CACHE": "0"}
    script = tmp_path / "train.py"
    if launch == "python":  # held from the first backend
        script.write_text(SCRIPT)
        command = [sys.executable, str(script)]
    else:  # held from the launch: the script's imports too
        script.write_text(SCRIPT.replace("gc.set_threshold(700, 10, 10)\n", ""))
        command = [sys.executable, "-m", "cerebrax", "run", str(script)]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["backend"] == seen["built"] == [10_000, 1_000, 1_000]
    if launch == "python":
        assert seen["before"] == seen["after"] == [700, 10, 10]
    else:
        assert seen["before"] == [10_000, 1_000, 1_000]
        default = subprocess.run([sys.executable, "-c", "import gc; print(gc.get_threshold())"],
                                 capture_output=True, text=True, check=True).stdout
        assert tuple(seen["after"]) == ast.literal_eval(default)  # Python's own
