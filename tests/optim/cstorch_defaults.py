"""cstorch 2.10's optimizer defaults and torch's where they differ, for the tests.

cerebrax's optimizers take cstorch's defaults (research/cstorch_2x_surface.md) and keep
torch's update math. A test that compares with ``torch.optim`` passes torch's values
explicitly, with :func:`as_torch`.
"""

from __future__ import annotations

from typing import Any

REQUIRED = object()  # no default: the argument must be given

# cstorch 2.10's signatures: every argument of the list with its default.
CSTORCH_DEFAULTS: dict[str, dict[str, Any]] = {
    "ASGD": dict(lr=0.01, lambd=0.0001, alpha=0.75, t0=1000000.0, weight_decay=0,
                 maximize=False),
    "Adadelta": dict(lr=1.0, rho=0.9, eps=1e-06, weight_decay=0, maximize=False),
    "Adagrad": dict(lr=0.01, lr_decay=0, weight_decay=0, initial_accumulator_value=0,
                    eps=1e-06, maximize=False),
    "AdamW": dict(lr=0.001, betas=(0.9, 0.999), eps=1e-06, weight_decay=0.0,
                  correct_bias=True, amsgrad=False),
    "Adam": dict(lr=0.001, betas=(0.9, 0.999), eps=1e-06, weight_decay=0.0, amsgrad=False),
    "Adamax": dict(lr=0.001, betas=(0.9, 0.999), eps=1e-06, weight_decay=0.0,
                   maximize=False),
    "Lamb": dict(lr=0.001, betas=(0.9, 0.999), eps=1e-06, weight_decay=0, adam=False),
    "Lion": dict(lr=0.0001, betas=(0.9, 0.99), weight_decay=0.0),
    "Muon": dict(lr=0.02, weight_decay=0.01, momentum=0.95, nesterov=True, ns_steps=5),
    "NAdam": dict(lr=0.002, betas=(0.9, 0.999), eps=1e-08, weight_decay=0,
                  momentum_decay=0.004),
    "RAdam": dict(lr=0.001, betas=(0.9, 0.999), eps=1e-06, weight_decay=0.0),
    "RMSprop": dict(lr=0.01, alpha=0.99, eps=1e-08, weight_decay=0, momentum=0,
                    centered=False),
    "Rprop": dict(lr=0.001, etas=(0.5, 1.2), step_sizes=(1e-06, 50.0)),
    "SGD": dict(lr=REQUIRED, momentum=0, dampening=0, weight_decay=0, nesterov=False,
                maximize=False),
    # cerebrax keeps torch's update rule and argument names for Adafactor; of cstorch's
    # defaults it takes the required lr and keeps eps=(None, 1e-3): under torch's rule
    # cstorch's eps[0]=1e-30 floors v at 0 in float32 (see the class docstring).
    "Adafactor": dict(lr=REQUIRED, weight_decay=0.0),
}

# torch.optim's defaults where they differ from cstorch's (what a torch comparison passes).
TORCH_DEFAULTS: dict[str, dict[str, Any]] = {
    "Adagrad": {"eps": 1e-10},
    "Adam": {"eps": 1e-08},
    "AdamW": {"eps": 1e-08, "weight_decay": 0.01},
    "Adamax": {"lr": 0.002, "eps": 1e-08},
    "RAdam": {"eps": 1e-08},
    "Rprop": {"lr": 0.01},
    "SGD": {"lr": 0.001},
    "Adafactor": {"lr": 0.01},
    "Muon": {"lr": 0.001, "weight_decay": 0.1},
}


def as_torch(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with torch's defaults for ``name`` where cstorch's differ and none is given."""
    return {**TORCH_DEFAULTS.get(name, {}), **kwargs}
