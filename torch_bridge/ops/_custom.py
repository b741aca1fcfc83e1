"""torch_bridge's own torch operators, lowered like ATen ops.

``torch.ops.torch_bridge.stop_gradient`` marks ``x.detach()`` and ``torch.no_grad()``
blocks before an exported program is decomposed (see ``torch_bridge._export``):
decomposition would otherwise turn both into plain aliases, and ``jax.grad`` would
differentiate through them. It lowers to ``lax.stop_gradient`` (``ops/shape.py``).
"""

from __future__ import annotations

import torch

__all__ = ["stop_gradient"]


@torch.library.custom_op("torch_bridge::stop_gradient", mutates_args=())
def stop_gradient(x: torch.Tensor) -> torch.Tensor:
    """Identity whose output carries no gradient (marks `detach` and no-grad blocks)."""
    return x.clone()


@stop_gradient.register_fake
def _stop_gradient_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)
