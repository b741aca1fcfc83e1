"""cstorch 2.10's defaults, read back exactly, with torch's update math.

The expected defaults are cstorch's signatures (cstorch_defaults.py); the torch values a
comparison passes are checked against torch.optim's own signatures, so the table of
differences cannot drift from either side.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from cstorch_defaults import CSTORCH_DEFAULTS, REQUIRED, TORCH_DEFAULTS
from optim_harness import (
    GivenGradients,
    gradients,
    initial,
    make_step,
    max_param_error,
    torch_params,
    torch_step,
)

import cerebrax as cstorch

torch = pytest.importorskip("torch")


def _default(cls: type, name: str):
    parameter = inspect.signature(cls).parameters[name]
    return REQUIRED if parameter.default is inspect.Parameter.empty else parameter.default


@pytest.mark.parametrize("name", sorted(CSTORCH_DEFAULTS))
def test_signature_defaults_are_cstorchs(name):
    cls = getattr(cstorch.optim, name)
    for arg, want in CSTORCH_DEFAULTS[name].items():
        got = _default(cls, arg)
        assert got is want if want is REQUIRED else got == want, (name, arg, got, want)
        assert type(got) is type(want), (name, arg, got, want)  # 0 stays int, 50.0 float


@pytest.mark.parametrize("name", sorted(TORCH_DEFAULTS))
def test_torch_defaults_table_is_torchs_and_differs_from_ours(name):
    ours, theirs = getattr(cstorch.optim, name), getattr(torch.optim, name)
    for arg, value in TORCH_DEFAULTS[name].items():
        assert _default(theirs, arg) == value, (name, arg)
        assert _default(ours, arg) != value, (name, arg)


def test_sgd_and_adafactor_need_a_learning_rate():
    ours = GivenGradients(initial())
    for cls in (cstorch.optim.SGD, cstorch.optim.Adafactor):
        with pytest.raises(TypeError, match="lr"):
            cls(ours.ordered)


@pytest.mark.parametrize("name", ["Adam", "AdamW", "Adamax", "Adagrad", "RAdam", "Rprop"])
def test_defaults_are_torchs_update_with_cstorchs_values(name):
    """A default-built optimizer runs torch's update with cstorch's values in place of
    torch's defaults (so the defaults are in effect, not only in the signature)."""
    init, grads = initial(), gradients(20)
    ours = GivenGradients(init)
    step = make_step(ours.model, getattr(cstorch.optim, name)(ours.ordered))
    theirs = torch_params(init)
    cstorch_values = {k: CSTORCH_DEFAULTS[name][k] for k in TORCH_DEFAULTS[name]}
    topt = getattr(torch.optim, name)(list(theirs.values()), **cstorch_values)
    for g in grads:
        step(g)
        torch_step(topt, theirs, g)
    assert max_param_error(ours, theirs) <= 1e-5


@pytest.mark.parametrize(
    "name, kwargs",
    [("AdamW", {"lr": 3e-4, "eps": 1e-8, "weight_decay": 0.1, "betas": (0.9, 0.95)}),
     ("SGD", {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}),
     ("Rprop", {"lr": 0.01, "etas": (0.3, 1.7), "step_sizes": (1e-7, 3.3)}),
     ("Adagrad", {"lr": 0.07, "lr_decay": 1e-3, "eps": 1e-10})],
)
def test_param_groups_hold_the_python_values_given(name, kwargs):
    ours = GivenGradients(initial())
    groups = [{"params": ours.ordered[:1], "lr": 0.3}, {"params": ours.ordered[1:]}]
    optimizer = getattr(cstorch.optim, name)(groups, **kwargs)
    want = [{**kwargs, "lr": 0.3}, kwargs]

    def check():
        for group, expected in zip(optimizer.param_groups, want, strict=True):
            for key, value in expected.items():
                got = group[key]
                assert got == value and type(got) is type(value), (key, got, value)

    check()
    step = make_step(ours.model, optimizer)
    for g in gradients(3):
        step(g)
    check()
    for saved, expected in zip(optimizer.state_dict()["param_groups"], want, strict=True):
        assert {k: saved[k] for k in expected} == expected


def test_python_values_survive_a_host_assignment_without_recompiling():
    init, grads = initial(), gradients(4)
    ours = GivenGradients(init)
    optimizer = cstorch.optim.SGD(ours.ordered, lr=0.1)
    step = make_step(ours.model, optimizer)
    tparams = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in init.items()}
    topt = torch.optim.SGD(list(tparams.values()), lr=0.1)
    for i, g in enumerate(grads):
        lr = 0.1 / (i + 3)  # 1/30, 1/40, ...: none is a float32 number
        optimizer.param_groups[0]["lr"] = lr
        topt.param_groups[0]["lr"] = lr
        step(g)
        for k, p in tparams.items():
            p.grad = torch.tensor(g[k])
        topt.step()
        assert optimizer.param_groups[0]["lr"] == lr  # exactly, not float32-rounded
        assert float(np.float32(lr)) != lr
    assert step.num_compiles == 1
    assert max_param_error(ours, tparams) <= 1e-6


def test_a_value_written_by_a_scheduler_reads_back_from_the_state():
    ours = GivenGradients(initial())
    optimizer = cstorch.optim.AdamW(ours.ordered, lr=0.1)
    scheduler = cstorch.optim.lr_scheduler.ExponentialLR(optimizer, 0.1, 1, 0.5)
    step = make_step(ours.model, optimizer, scheduler)
    for g in gradients(3):
        step(g)
    lr = optimizer.param_groups[0]["lr"]
    assert type(lr) is float and lr == pytest.approx(0.1 * 0.5**3, rel=1e-6)
    assert lr != 0.1 * 0.5**3  # the state's float32 value, not a stale Python one
    assert optimizer.param_groups[0]["eps"] == 1e-6
