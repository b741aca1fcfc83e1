"""The argument errors the declared optimizers raise that their hand-written classes did not,
and the state-dict error every layout shares."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import cerebrax as cstorch  # noqa: E402


def params():
    return cstorch.compile(torch.nn.Linear(2, 1), "CPU").parameters()


@pytest.mark.parametrize("name", ["Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Lamb", "Lion"])
def test_betas_must_be_two_coefficients(name):
    with pytest.raises(cstorch.ConfigError, match=r"Invalid betas: \(0\.9, 0\.99, 0\.999\) "
                                                  r"\(expected two coefficients\)"):
        getattr(cstorch.optim, name)(params(), betas=(0.9, 0.99, 0.999))


def test_sgd_refuses_a_nan_learning_rate():
    with pytest.raises(cstorch.ConfigError, match="Invalid learning rate: nan"):
        cstorch.optim.SGD(params(), lr=math.nan)


@pytest.mark.parametrize("name", ["SGD", "Adam", "Adafactor", "RMSprop"])
def test_differentiable_is_refused_in_one_wording(name):
    with pytest.raises(cstorch.ConfigError, match=rf"{name}\(differentiable=True\) is not "
                                                  "supported by cerebrax: the step is compiled"):
        getattr(cstorch.optim, name)(params(), lr=0.1, differentiable=True)


def test_flags_are_bools():
    assert cstorch.optim.Lamb(params(), adam=1).defaults["adam"] is True
    assert cstorch.optim.SGD(params(), lr=0.1, momentum=0.9, nesterov=1).defaults["nesterov"] \
        is True


@pytest.mark.parametrize("name, kwargs, key", [
    ("SGD", {"lr": 0.1, "momentum": 0.9}, "momentum_buffer"),
    ("Lion", {}, "exp_avg"),
])
def test_a_buffer_for_only_some_parameters_is_refused(name, kwargs, key):
    optimizer = getattr(cstorch.optim, name)(params(), **kwargs)
    state = optimizer.state_dict()
    state["state"] = {0: {key: torch.zeros(1, 2)}}
    with pytest.raises(cstorch.ConfigError, match=rf"loaded {name} state has '{key}' for only "
                                                  "some parameters of a group"):
        optimizer.load_state_dict(state)
