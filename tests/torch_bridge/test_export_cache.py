"""The export cache: a graph kept by one process and loaded by another is the graph the
export gives (the same JAX program, equation for equation), and the key misses on any
change to what the export read."""

from __future__ import annotations

import importlib
import os
import sys
import time

import jax
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_bridge
from cerebrax._runtime import RUNTIME
from torch_bridge import _export_cache

from bridge_zoo import CNN, GPT, MLP, Recurrent, ResNet, UNet, images, seeded

SCALE = 1.0  # a global that Scaled's forward reads


class Scaled(nn.Module):
    def __init__(self, factor=1.0):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.factor = factor
        self.table = torch.arange(3.0)  # a constant of the graph, not a buffer

    def forward(self, x):
        return self.fc(x) * self.factor * SCALE + self.table


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setattr(RUNTIME, "export_cache_dir", str(tmp_path / "torch_export"))
    monkeypatch.delenv(_export_cache.ENV, raising=False)
    return tmp_path / "torch_export"


@pytest.fixture
def exports(monkeypatch):
    """Counts the exports that run (a graph loaded from the cache is not one)."""
    import torch_bridge._export as export

    count = []
    original = export.export_program
    monkeypatch.setattr(export, "export_program",
                        lambda *a, **k: count.append(1) or original(*a, **k))
    return count


def program(module, inputs, *, train):
    return torch_bridge.convert(module, train=train).program(inputs)


def run(module, prog, x):
    converted = torch_bridge.convert(module)
    out = prog.run(converted.params, converted.buffers, [jax.numpy.asarray(x.numpy())], None)
    return torch.from_numpy(np.array(out[0][0]))


def jaxpr(module, prog, inputs, key=None):
    converted = torch_bridge.convert(module)
    xs = [jax.numpy.asarray(x.numpy()) for x in inputs]
    return str(jax.make_jaxpr(lambda p, b, *x: prog.run(p, b, list(x), key))(
        converted.params, converted.buffers, *xs))


CASES = {
    "mlp": (lambda: seeded(MLP), lambda: (torch.randn(5, 16),), False),
    "cnn, train, dropout": (lambda: seeded(CNN, p=0.3), lambda: (images(),), True),
    "resnet": (lambda: seeded(ResNet), lambda: (images(),), True),
    "gpt": (lambda: seeded(GPT), lambda: (torch.randint(0, 50, (2, 8)),), True),
    "lstm": (lambda: seeded(Recurrent), lambda: (torch.randn(3, 6, 8),), False),
    "unet": (lambda: seeded(UNet), lambda: (images(size=16),), False),
    "constant tensor": (lambda: seeded(Scaled, 0.5), lambda: (torch.randn(2, 4),), False),
    # nn.Sequential's input is named "input", a name FX gives a node another way
    "sequential": (lambda: seeded(lambda: nn.Sequential(nn.Linear(4, 3), nn.Tanh())),
                   lambda: (torch.randn(2, 4),), True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_kept_graph_is_the_exported_one(folder, exports, case):
    make, inputs, train = CASES[case]
    module, x = make(), inputs()
    exported = program(module, x, train=train)
    assert len(exports) == 1 and len(list(folder.iterdir())) == 1
    loaded = program(module, x, train=train)
    assert len(exports) == 1  # loaded, not exported again
    assert loaded is not exported
    key = jax.random.key(0) if exported.needs_key else None
    assert loaded.needs_key == exported.needs_key
    assert jaxpr(module, loaded, x, key) == jaxpr(module, exported, x, key)
    assert loaded.out_spec == exported.out_spec and loaded.ops == exported.ops


def test_the_key_misses_on_what_the_export_reads(folder, exports, monkeypatch):
    module = seeded(Scaled, 0.5)
    x = torch.randn(2, 4)
    signature = (False, None, "call")
    first = _export_cache.key(module, signature)
    assert first is not None and first == _export_cache.key(seeded(Scaled, 0.5), signature)
    changes = {
        "attribute": lambda m: setattr(m, "factor", 0.25),
        "constant tensor": lambda m: m.table.add_(1.0),
        "parameter shape": lambda m: setattr(m, "fc", nn.Linear(4, 3, bias=False)),
        "parameter dtype": lambda m: m.fc.to(torch.float64),
        "global": lambda m: globals().update(SCALE=2.0),
    }
    for what, change in changes.items():
        changed = seeded(Scaled, 0.5)
        try:
            change(changed)
            assert _export_cache.key(changed, signature) != first, what
        finally:
            globals().update(SCALE=1.0)
    assert _export_cache.key(module, (False, None, "other call")) != first
    # A different value in a global is a different graph, exported; each runs as eager.
    before = program(module, (x,), train=False)
    monkeypatch.setattr(sys.modules[__name__], "SCALE", 3.0)
    after = program(module, (x,), train=False)
    assert len(exports) == 2
    torch.testing.assert_close(run(module, after, x), module(x).detach())
    assert not torch.allclose(run(module, before, x), run(module, after, x))


def test_a_torch_function_patched_at_run_time_misses(folder, monkeypatch):
    module, signature = seeded(MLP), ("call",)
    first = _export_cache.key(module, signature)
    gelu, forward = F.gelu, nn.Linear.forward
    for target, name, patch in ((F, "gelu", lambda x, approximate="none": gelu(x) * 2),
                                (nn.Linear, "forward", lambda self, x: forward(self, x))):
        with monkeypatch.context() as patched:
            patched.setattr(target, name, patch)
            assert _export_cache.key(module, signature) != first, name
    assert _export_cache.key(module, signature) == first


def test_an_edited_source_file_is_exported_again(folder, exports, tmp_path, monkeypatch):
    source = tmp_path / "edited_model.py"
    code = ("import torch\n\nclass Net(torch.nn.Module):\n"
            "    def __init__(self):\n        super().__init__()\n"
            "        self.fc = torch.nn.Linear(3, 2)\n\n"
            "    def forward(self, x):\n        return torch.{}(self.fc(x))\n")
    source.write_text(code.format("tanh"))
    monkeypatch.syspath_prepend(str(tmp_path))
    import edited_model

    x = (torch.randn(4, 3),)
    program(edited_model.Net(), x, train=False)
    program(edited_model.Net(), x, train=False)
    assert len(exports) == 1
    source.write_text(code.format("relu"))  # the same size: its time tells
    os.utime(source, ns=(time.time_ns(), time.time_ns() + 10**9))
    edited = importlib.reload(edited_model)
    prog = program(edited.Net(), x, train=False)
    assert len(exports) == 2 and "aten.relu.default" in prog.ops
    monkeypatch.delitem(sys.modules, "edited_model")


def test_what_the_key_cannot_see_is_not_kept(folder, exports):
    class Local(nn.Module):  # defined in a function: its code has no place in a file
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            return self.fc(x)

    hooked = seeded(MLP)
    hooked.layers[0].register_forward_hook(lambda m, i, o: o * 2)
    for module in (Local(), hooked):
        assert _export_cache.key(module, ("call",)) is None
    x = (torch.randn(2, 3),)
    program(Local(), x, train=False)
    program(Local(), x, train=False)
    assert len(exports) == 2 and not folder.exists()


class Doubled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class WithFunction(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return Doubled.apply(self.fc(x))


def test_a_graph_that_calls_back_into_python_is_not_kept(folder, exports):
    x = (torch.randn(2, 3),)
    module = seeded(WithFunction)
    program(module, x, train=True)
    program(module, x, train=True)
    assert len(exports) == 2 and not (folder.exists() and any(folder.iterdir()))


def test_the_switch_and_a_damaged_entry(folder, exports, monkeypatch):
    module, x = seeded(MLP), torch.randn(5, 16)
    monkeypatch.setenv(_export_cache.ENV, "0")
    assert _export_cache.directory() is None
    program(module, (x,), train=False)
    assert not folder.exists()
    monkeypatch.delenv(_export_cache.ENV)
    program(module, (x,), train=False)
    (entry,) = folder.iterdir()
    entry.write_bytes(entry.read_bytes()[:100])
    prog = program(module, (x,), train=False)  # exported again, and correct
    assert len(exports) == 3
    torch.testing.assert_close(run(module, prog, x), module(x).detach())
