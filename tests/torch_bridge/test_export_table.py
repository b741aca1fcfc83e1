"""The bridge's export decomposes with a core ATen table built once per set of registered
CompositeImplicitAutograd ops, and looks torch's ops up once per such set: the graphs it
gives equal those of torch's own table built afresh for the call."""

from __future__ import annotations

import contextlib

import pytest
import torch

import torch_bridge._export as export


def _fresh_table():
    table = torch.export.default_decompositions()
    for op in export.KEPT_WHOLE:
        table.pop(op, None)
    return table


@contextlib.contextmanager
def _torch_as_it_is(monkeypatch: pytest.MonkeyPatch):
    """The bridge's export with torch's table built afresh and its lookups every time."""
    with monkeypatch.context() as patch:
        patch.setenv("CEREBRAX_EXPORT_CACHE", "0")  # every call exports
        patch.setattr(export, "_decompositions", _fresh_table)
        patch.setattr(export, "_fast_decomposition", contextlib.nullcontext)
        yield


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.norm = torch.nn.BatchNorm2d(4)
        self.rnn = torch.nn.LSTM(4, 5, batch_first=True)
        self.head = torch.nn.Linear(5, 2)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.norm(self.conv(x)))
        seq = h.flatten(2).transpose(1, 2)
        out, _ = self.rnn(torch.nn.functional.layer_norm(seq, seq.shape[-1:]))
        return torch.nn.functional.log_softmax(self.head(out.mean(1)), -1)


@pytest.mark.parametrize("train", [True, False])
def test_the_graph_is_the_one_of_torchs_fresh_table(monkeypatch, train):
    module, args = _Net(), (torch.randn(2, 3, 6, 6),)
    ours, _ = export.export_program(module, args, {}, train=train)
    with _torch_as_it_is(monkeypatch):
        theirs, _ = export.export_program(module, args, {}, train=train)
    assert str(ours.graph) == str(theirs.graph)
    assert aten_ops(ours) == aten_ops(theirs)
    assert torch.ops.aten.lstm.input in aten_ops(ours)  # kept whole, as before


def aten_ops(program) -> set:
    return {n.target for n in program.graph.nodes if n.op == "call_function"}


def test_an_op_registered_after_a_first_export_is_decomposed_as_torch_does(monkeypatch):
    """A custom op with a CompositeImplicitAutograd kernel, defined after the table was
    built, is decomposed into its kernel's ops, as torch's fresh table does, and the
    lookup finds it (it is a new set of registrations)."""
    module, args = torch.nn.Linear(3, 2), (torch.randn(4, 3),)
    export.export_program(module, args, {}, train=True)  # the table of today's ops
    library = torch.library.Library("cerebrax_test_table", "DEF")
    try:
        library.define("twice(Tensor x) -> Tensor")
        library.impl("twice", lambda x: x * 2 + 0, "CompositeImplicitAutograd")

        class Twice(torch.nn.Module):
            def forward(self, x):
                return torch.ops.cerebrax_test_table.twice(x) + 1

        ours, _ = export.export_program(Twice(), args, {}, train=True)
        with _torch_as_it_is(monkeypatch):
            theirs, _ = export.export_program(Twice(), args, {}, train=True)
        assert aten_ops(ours) == aten_ops(theirs)
        assert torch.ops.cerebrax_test_table.twice.default not in aten_ops(ours)
        assert str(ours.graph) == str(theirs.graph)
    finally:
        library._destroy()


def test_torchs_lookup_is_restored_after_the_export():
    import torch._export.utils as utils

    before = utils._materialize_cpp_cia_ops
    export.export_program(torch.nn.Linear(3, 2), (torch.randn(4, 3),), {}, train=True)
    assert utils._materialize_cpp_cia_ops is before
