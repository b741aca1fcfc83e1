"""Every optimizer that torch.optim has, against torch.optim: one table, 50 traced steps.

Both sides consume identical gradients (see optim_harness); the table holds at least three
settings per optimizer, one of them with two param groups whose lr and weight decay
differ. Lamb and Lion, which torch does not have, are checked against their formulas in
test_lamb_lion_adafactor.py.
"""

from __future__ import annotations

import pytest

import cerebrax as cstorch

torch = pytest.importorskip("torch")
from cstorch_defaults import as_torch  # noqa: E402
from optim_harness import max_param_error, max_state_error, run_both  # noqa: E402

STEPS = 50
TOLERANCE = 1e-5

# (case id, optimizer class name, kwargs, param groups: [(parameter names, overrides)] or None)
_OPTIMIZERS_UNDER_TEST = [
    ("sgd", "SGD", {"lr": 0.1}, None),
    ("sgd-momentum", "SGD", {"lr": 0.05, "momentum": 0.9}, None),
    (
        "sgd-nesterov-wd",
        "SGD",
        {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-2},
        None,
    ),
    ("sgd-dampening", "SGD", {"lr": 0.05, "momentum": 0.5, "dampening": 0.3}, None),
    ("sgd-maximize", "SGD", {"lr": 0.01, "momentum": 0.8, "maximize": True}, None),
    (
        "sgd-groups",
        "SGD",
        {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-2},
        [(["a.weight", "a.bias"], {"lr": 0.1, "weight_decay": 0.0}), (["b.weight"], {})],
    ),
    ("adamw", "AdamW", {}, None),
    (
        "adamw-custom",
        "AdamW",
        {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1},
        None,
    ),
    ("adamw-amsgrad", "AdamW", {"lr": 5e-3, "amsgrad": True}, None),
    ("adamw-maximize", "AdamW", {"lr": 1e-3, "maximize": True, "weight_decay": 0.0}, None),
    (
        "adamw-groups",
        "AdamW",
        {"lr": 3e-3, "weight_decay": 0.2},
        [(["a.weight", "a.bias"], {"lr": 1e-2, "weight_decay": 0.0}), (["b.weight"], {})],
    ),
    ("adam", "Adam", {}, None),
    (
        "adam-l2-custom",
        "Adam",
        {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-06, "weight_decay": 0.1},
        None,
    ),
    (
        "adam-amsgrad-maximize",
        "Adam",
        {"lr": 0.005, "amsgrad": True, "maximize": True, "weight_decay": 0.01},
        None,
    ),
    (
        "adam-decoupled",
        "Adam",
        {"lr": 0.003, "weight_decay": 0.05, "decoupled_weight_decay": True},
        None,
    ),
    (
        "adam-groups",
        "Adam",
        {"lr": 0.001, "weight_decay": 0.2},
        [(["a.weight", "a.bias"], {"lr": 0.01, "weight_decay": 0.0}), (["b.weight"], {})],
    ),
    ("adamax", "Adamax", {}, None),
    (
        "adamax-l2-custom",
        "Adamax",
        {"lr": 0.01, "betas": (0.5, 0.9), "eps": 0.0001, "weight_decay": 0.1},
        None,
    ),
    ("adamax-maximize", "Adamax", {"lr": 0.005, "maximize": True}, None),
    (
        "adamax-groups",
        "Adamax",
        {"lr": 0.002, "weight_decay": 0.05},
        [(["a.weight", "a.bias"], {"lr": 0.02, "weight_decay": 0.3}), (["b.weight"], {})],
    ),
    ("nadam", "NAdam", {}, None),
    (
        "nadam-l2-custom",
        "NAdam",
        {
            "lr": 0.01,
            "betas": (0.95, 0.99),
            "eps": 1e-06,
            "weight_decay": 0.1,
            "momentum_decay": 0.05,
        },
        None,
    ),
    (
        "nadam-decoupled-maximize",
        "NAdam",
        {"lr": 0.005, "weight_decay": 0.02, "decoupled_weight_decay": True, "maximize": True},
        None,
    ),
    (
        "nadam-groups",
        "NAdam",
        {"lr": 0.002, "weight_decay": 0.1},
        [(["a.weight", "a.bias"], {"lr": 0.01, "weight_decay": 0.01}), (["b.weight"], {})],
    ),
    ("radam", "RAdam", {}, None),
    (
        "radam-l2-custom",
        "RAdam",
        {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-06, "weight_decay": 0.1},
        None,
    ),
    (
        "radam-decoupled-maximize",
        "RAdam",
        {
            "lr": 0.005,
            "betas": (0.9, 0.9999),
            "weight_decay": 0.02,
            "decoupled_weight_decay": True,
            "maximize": True,
        },
        None,
    ),
    ("radam-late-rectification", "RAdam", {"lr": 0.01, "betas": (0.9, 0.7)}, None),
    ("radam-never-rectified", "RAdam", {"lr": 0.01, "betas": (0.0, 0.6)}, None),
    (
        "radam-groups",
        "RAdam",
        {"lr": 0.001, "weight_decay": 0.1},
        [(["a.weight", "a.bias"], {"lr": 0.03, "weight_decay": 0.0}), (["b.weight"], {})],
    ),
    ("adagrad", "Adagrad", {}, None),
    (
        "adagrad-decay-wd-init",
        "Adagrad",
        {
            "lr": 0.05,
            "lr_decay": 0.01,
            "weight_decay": 0.01,
            "initial_accumulator_value": 0.1,
            "eps": 1e-08,
        },
        None,
    ),
    ("adagrad-maximize", "Adagrad", {"lr": 0.02, "eps": 1e-06, "maximize": True}, None),
    (
        "adagrad-groups",
        "Adagrad",
        {"lr": 0.01, "weight_decay": 0.1, "lr_decay": 0.001},
        [(["a.weight", "a.bias"], {"lr": 0.03, "weight_decay": 0.01}), (["b.weight"], {})],
    ),
    ("adadelta", "Adadelta", {}, None),
    (
        "adadelta-rho-wd",
        "Adadelta",
        {"lr": 0.5, "rho": 0.5, "eps": 0.0001, "weight_decay": 0.01},
        None,
    ),
    ("adadelta-maximize", "Adadelta", {"lr": 2.0, "rho": 0.95, "maximize": True}, None),
    (
        "adadelta-groups",
        "Adadelta",
        {"lr": 1.0, "weight_decay": 0.05},
        [(["a.weight", "a.bias"], {"lr": 0.3, "weight_decay": 0.0}), (["b.weight"], {})],
    ),
    ("asgd", "ASGD", {}, None),
    (
        "asgd-averaging-wd",
        "ASGD",
        {"lr": 0.05, "lambd": 0.01, "alpha": 0.5, "t0": 10, "weight_decay": 0.01},
        None,
    ),
    ("asgd-maximize", "ASGD", {"lr": 0.02, "t0": 0, "maximize": True}, None),
    (
        "asgd-groups",
        "ASGD",
        {"lr": 0.01, "t0": 5, "weight_decay": 0.1},
        [(["a.weight", "a.bias"], {"lr": 0.04, "weight_decay": 0.0}), (["b.weight"], {})],
    ),
    ("rmsprop", "RMSprop", {}, None),
    ("rmsprop-centered", "RMSprop", {"lr": 0.001, "alpha": 0.9, "centered": True}, None),
    ("rmsprop-momentum-wd", "RMSprop", {"lr": 0.001, "momentum": 0.9, "weight_decay": 0.01}, None),
    (
        "rmsprop-centered-momentum-maximize",
        "RMSprop",
        {
            "lr": 0.005,
            "alpha": 0.95,
            "eps": 1e-06,
            "momentum": 0.5,
            "centered": True,
            "maximize": True,
        },
        None,
    ),
    (
        "rmsprop-groups",
        "RMSprop",
        {"lr": 0.01, "weight_decay": 0.1},
        [
            (["a.weight", "a.bias"], {"lr": 0.001, "weight_decay": 0.0, "momentum": 0.8}),
            (["b.weight"], {}),
        ],
    ),
    ("rprop", "Rprop", {}, None),
    (
        "rprop-etas-sizes",
        "Rprop",
        {"lr": 0.05, "etas": (0.3, 1.5), "step_sizes": (0.0001, 1.0)},
        None,
    ),
    ("rprop-maximize", "Rprop", {"lr": 0.001, "maximize": True}, None),
    (
        "rprop-groups",
        "Rprop",
        {"lr": 0.01, "etas": (0.5, 1.2)},
        [(["a.weight", "a.bias"], {"lr": 0.001, "etas": (0.4, 1.1)}), (["b.weight"], {})],
    ),
    ("adafactor-defaults", "Adafactor", {}, None),
    (
        "adafactor-custom",
        "Adafactor",
        {"lr": 0.05, "beta2_decay": -0.5, "eps": (0.001, 0.01), "d": 1.5, "weight_decay": 0.1},
        None,
    ),
    ("adafactor-relative-step-cap", "Adafactor", {"lr": 1.0, "weight_decay": 0.001}, None),
    (
        "adafactor-maximize-foreach",
        "Adafactor",
        {"lr": 0.02, "maximize": True, "foreach": True, "eps": (1e-30, 0.001)},
        None,
    ),
    (
        "adafactor-two-groups",
        "Adafactor",
        {"lr": 0.01, "weight_decay": 0.05},
        [(["a.weight", "a.bias"], {"lr": 0.03, "weight_decay": 0.0}), (["b.weight"], {})],
    ),
]


def _groups(spec):
    if spec is None:
        return None
    return lambda params: [{"params": [params[n] for n in names], **over} for names, over in spec]


@pytest.mark.parametrize(
    "case_id, name, kwargs, groups",
    _OPTIMIZERS_UNDER_TEST,
    ids=[c[0] for c in _OPTIMIZERS_UNDER_TEST],
)
def test_matches_torch_over_50_steps(case_id, name, kwargs, groups):
    (ours, optimizer, step), (theirs, torch_optimizer) = run_both(
        getattr(cstorch.optim, name), getattr(torch.optim, name), as_torch(name, kwargs), STEPS,
        _groups(groups),
    )
    assert max_param_error(ours, theirs) <= TOLERANCE
    assert max_state_error(optimizer, torch_optimizer) <= TOLERANCE
    assert step.num_compiles == 1
    mine = optimizer.state_dict()["param_groups"]
    want = torch_optimizer.state_dict()["param_groups"]
    for g_mine, g_want in zip(mine, want, strict=True):
        assert g_mine["params"] == g_want["params"]
        for key in ("lr", "weight_decay", *kwargs):
            if key in g_want and key not in ("foreach",):
                assert g_mine[key] == pytest.approx(g_want[key]), key


def test_every_torch_optimizer_is_in_the_table():
    covered = {name for _, name, _, _ in _OPTIMIZERS_UNDER_TEST}
    assert covered == {
        "SGD",
        "Adam",
        "AdamW",
        "Adamax",
        "Adadelta",
        "Adagrad",
        "ASGD",
        "NAdam",
        "RAdam",
        "RMSprop",
        "Rprop",
        "Adafactor",
    }
    for name in covered:
        settings = [c for c in _OPTIMIZERS_UNDER_TEST if c[1] == name]
        assert len(settings) >= 3, name
        assert any(c[3] is not None for c in settings), f"{name} has no param-group case"
