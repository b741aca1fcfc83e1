"""``cstorch.nn.functional``: ``one_hot`` and the mixture-of-experts matmuls, written in
torch so that torch eager and a traced step compute the same values.

- ``one_hot(x, num_classes)`` is ``torch.nn.functional.one_hot`` (int64 result).
- ``sparse_matmul(input, indices, weight)``: each token's top-k inputs multiplied by the
  weights of the experts that ``indices`` picks. ``input`` is ``(..., k, in)``,
  ``indices`` ``(..., k)`` (expert ids), ``weight`` ``(out, experts, in)``; the result is
  ``(..., k, out)`` with ``result[..., j, o] = sum_i input[..., j, i] *
  weight[o, indices[..., j], i]``.
- ``sparse_act_matmul(input, act_mask, weight, dense_capacity=None)``: ``input @
  weight.T`` for the tokens whose ``act_mask`` is nonzero, and 0 for the others.
  ``input`` is ``(..., in)``, ``act_mask`` ``(...)``, ``weight`` ``(out, in)``.
  ``dense_capacity`` is a hint to the wafer's kernel about how many tokens are active;
  it does not change the values.
"""

from __future__ import annotations

import torch

__all__ = ["one_hot", "sparse_act_matmul", "sparse_matmul"]

one_hot = torch.nn.functional.one_hot


def sparse_matmul(input: torch.Tensor, indices: torch.Tensor,
                  weight: torch.Tensor) -> torch.Tensor:
    """See the module docs."""
    if weight.dim() != 3 or input.shape[-1] != weight.shape[-1]:
        raise ValueError(
            f"sparse_matmul: weight must be (out, experts, in) with in = input.shape[-1] "
            f"({input.shape[-1]}), got {tuple(weight.shape)}.")
    if tuple(indices.shape) != tuple(input.shape[:-1]):
        raise ValueError(f"sparse_matmul: indices {tuple(indices.shape)} must have the "
                         f"shape of input without its last dimension, "
                         f"{tuple(input.shape[:-1])}.")
    chosen = weight.permute(1, 0, 2)[indices.long()]  # (..., k, out, in)
    return torch.matmul(chosen, input.unsqueeze(-1)).squeeze(-1)


def sparse_act_matmul(input: torch.Tensor, act_mask: torch.Tensor, weight: torch.Tensor,
                      dense_capacity: int | None = None) -> torch.Tensor:
    """See the module docs."""
    del dense_capacity  # a kernel hint; the values do not depend on it
    if tuple(act_mask.shape) != tuple(input.shape[:-1]):
        raise ValueError(f"sparse_act_matmul: act_mask {tuple(act_mask.shape)} must have "
                         f"the shape of input without its last dimension, "
                         f"{tuple(input.shape[:-1])}.")
    out = torch.nn.functional.linear(input, weight)
    return torch.where(act_mask.unsqueeze(-1) != 0, out, torch.zeros_like(out))
