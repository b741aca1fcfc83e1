"""configure_optimizer: names, learning_rate, nested options, legacy and unknown keys."""

from __future__ import annotations

import pytest
from helpers import compiled_mlp

import cerebrax as cstorch


@pytest.mark.parametrize("name", ["SGD", "sgd", "Sgd"])
def test_names_are_case_insensitive(name):
    model = compiled_mlp()
    optimizer = cstorch.optim.configure_optimizer(name, model.parameters(), lr=0.5)
    assert isinstance(optimizer, cstorch.optim.SGD)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5)


def test_learning_rate_becomes_lr_and_accepts_numeric_strings():
    model = compiled_mlp()
    optimizer = cstorch.optim.configure_optimizer(
        "AdamW", model.parameters(), learning_rate="3e-4", optim_params={"weight_decay": 0.1})
    group = optimizer.param_groups[0]
    assert group["lr"] == pytest.approx(3e-4)
    assert group["weight_decay"] == pytest.approx(0.1)


def test_unknown_type_lists_the_choices():
    model = compiled_mlp()
    with pytest.raises(cstorch.ConfigError, match=r"Invalid optimizer type. Expected one of \[") \
            as info:
        cstorch.optim.configure_optimizer("Sgdd", model.parameters())
    assert "'adamw'" in str(info.value) and "'sgd'" in str(info.value)
    assert "Got: Sgdd" in str(info.value)


@pytest.mark.parametrize("key, replacement", [("weight_decay_rate", "weight_decay"),
                                              ("beta1", "betas"), ("eps2", "eps")])
def test_legacy_keys_are_rejected_with_the_replacement(key, replacement):
    model = compiled_mlp()
    with pytest.raises(cstorch.ConfigError, match="no longer supported") as info:
        cstorch.optim.configure_optimizer("AdamW", model.parameters(), **{key: 0.1})
    assert f"expected: {replacement}, actual: {key}" in str(info.value)


def test_unknown_keys_warn_and_are_dropped():
    model = compiled_mlp()
    with pytest.warns(UserWarning, match="does not take \\['colour'\\]"):
        optimizer = cstorch.optim.configure_optimizer(
            "SGD", model.parameters(), lr=0.1, colour="blue")
    assert isinstance(optimizer, cstorch.optim.SGD)


def test_bad_values_name_the_optimizer():
    model = compiled_mlp()
    with pytest.raises(cstorch.ConfigError, match="learning_rate must be a number"):
        cstorch.optim.configure_optimizer("SGD", model.parameters(), learning_rate="fast")


def test_custom_optimizers_are_found():
    class MySignSGD(cstorch.optim.Optimizer):
        def __init__(self, params, lr):
            super().__init__(params, {"lr": lr})

        def preinitialize(self):
            pass

        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    p.value = p.value - group["lr"] * (p.grad > 0)

    model = compiled_mlp()
    optimizer = cstorch.optim.configure_optimizer("mysignsgd", model.parameters())
    assert isinstance(optimizer, MySignSGD)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)  # required lr -> 0.1
