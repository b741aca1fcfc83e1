"""The modules of ``cstorch.nn`` (see the package)."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import UnsupportedOpError

__all__ = ["SelectiveGrad", "SmoothL1Loss"]


class SmoothL1Loss(torch.nn.SmoothL1Loss):
    """cstorch's ``SmoothL1Loss``: torch's, with the same arguments and values (cstorch
    ships its own for its compiler; the arithmetic is torch's)."""


class SelectiveGrad:
    """cstorch's selective gradients (gradients computed for part of a parameter only,
    on the wafer) are not available in cerebrax: creating one is an error."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise UnsupportedOpError(
            "cstorch.nn.SelectiveGrad is not supported by cerebrax: it computes every "
            "parameter's full gradient, as torch does. Remove the SelectiveGrad callback "
            "(or its selective_grads setting) to train with full gradients.")
