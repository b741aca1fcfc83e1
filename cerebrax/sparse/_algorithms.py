"""The sparsity algorithm classes (see :mod:`cerebrax.sparse`): cstorch's names and
constructor signatures, and creating any of them is an error.

The signatures are cstorch's, with real annotations (this module does not postpone
them), so that a tool that builds a config class from a constructor accepts a config
naming one. Model Zoo builds a union over the algorithms that are not abstract,
discriminated by a config's ``algorithm`` (``static`` by default): a config without
sparsity validates, and one with sparsity is refused when the algorithm is created, with
:data:`MSG_NO_SPARSITY`. As in cstorch, ``DynamicSparsityAlgorithm`` is abstract.
"""

import abc
from collections.abc import Callable
from typing import Any

from ..errors import UnsupportedOpError

__all__ = ["GMP", "MSG_NO_SPARSITY", "SET", "DynamicSparsityAlgorithm", "Group",
           "HyperParameterScheduleType", "InitMethodType", "RigL", "SparsityAlgorithm",
           "Static", "UpdateScheduleType"]

MSG_NO_SPARSITY = """\
{what}: cerebrax does not implement weight sparsity; it trains every weight densely, as
torch does. Remove the sparsity setting (Trainer(sparsity=...), the `sparsity:` config
key, or the cstorch.sparse call) to train the dense model."""

InitMethodType = str | Callable[..., Any]
"""How a mask starts: a method's name (``"random"``, ``"topk"``, ...) or a function of
the parameter and its sparsity (cstorch's ``InitMethodType``)."""

HyperParameterScheduleType = (
    int | float | list[int] | list[float] | tuple | dict | Callable[..., Any])
"""A value over the steps: a constant, a list to cycle through, a schedule's dict
(``{"type": "cosine", "init": 0.3, "half_period": 1000}``) or a function of the step."""

UpdateScheduleType = dict | Callable[..., Any]
"""The steps that update the masks: ``{"freq": 100, "start": 0, "stop": 1000}``,
``{"steps": [...]}`` or a function of the step."""


class SparsityAlgorithm:
    """The base class of cstorch's sparsity algorithms; creating one is an error.

    Args:
      sparsity: the fraction of each weight to prune, or a schedule of it.
      init_method: how the masks start.
    """

    def __init__(self, sparsity: float | dict | None = None,
                 init_method: InitMethodType = "random") -> None:
        raise UnsupportedOpError(
            MSG_NO_SPARSITY.format(what=f"cstorch.sparse.{type(self).__name__}"))


class Static(SparsityAlgorithm):
    """Sparsity whose masks stay as they start; creating one is an error.

    Args:
      sparsity: the fraction of each weight to prune.
      **kwargs: the base class's other arguments (``init_method``).
    """

    def __init__(self, sparsity: float | None = None, **kwargs: Any) -> None:
        super().__init__()


class DynamicSparsityAlgorithm(SparsityAlgorithm, abc.ABC):
    """The base of the algorithms that update their masks while training.

    Args:
      sparsity: the fraction to prune, or a schedule of it.
      update: the steps that update the masks (every step without it).
      **kwargs: the base class's other arguments (``init_method``).
    """

    def __init__(self, sparsity: float | dict | None = None,
                 update: UpdateScheduleType | None = None, **kwargs: Any) -> None:
        super().__init__()

    @abc.abstractmethod
    def update_mask(self, p: Any, mask: Any, sparsity: Any) -> Any:
        """The new mask of parameter ``p`` at ``sparsity``: what each algorithm defines."""


def _no_mask_update(self: DynamicSparsityAlgorithm, p: Any, mask: Any, sparsity: Any) -> Any:
    """Never reached: creating the algorithm is an error."""
    raise UnsupportedOpError(MSG_NO_SPARSITY.format(
        what=f"cstorch.sparse.{type(self).__name__}.update_mask"))


class GMP(DynamicSparsityAlgorithm):
    """Gradual magnitude pruning; creating one is an error.

    Args:
      **kwargs: ``DynamicSparsityAlgorithm``'s arguments (a ``sparsity`` schedule).
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()

    update_mask = _no_mask_update


class SET(DynamicSparsityAlgorithm):
    """Sparse evolutionary training (drop the smallest weights, regrow at random);
    creating one is an error.

    Args:
      drop_fraction: the fraction of the kept weights each update drops.
      **kwargs: ``DynamicSparsityAlgorithm``'s arguments.
    """

    def __init__(self, drop_fraction: HyperParameterScheduleType = 0.3, **kwargs: Any) -> None:
        super().__init__()

    update_mask = _no_mask_update


class RigL(DynamicSparsityAlgorithm):
    """Rigging the lottery (drop the smallest weights, regrow where the dense gradient is
    largest); creating one is an error.

    Args:
      drop_fraction: the fraction of the kept weights each update drops.
      balance_in_groups: compare scores within this many groups of input columns.
      balance_out_groups: compare scores within this many groups of output rows.
      **kwargs: ``DynamicSparsityAlgorithm``'s arguments.
    """

    def __init__(self, drop_fraction: HyperParameterScheduleType = 0.3,
                 balance_in_groups: int | None = None,
                 balance_out_groups: int | None = None, **kwargs: Any) -> None:
        super().__init__()

    update_mask = _no_mask_update


class Group(SparsityAlgorithm):
    """Sparsity algorithms applied to the parameters whose names match a filter each;
    creating one is an error.

    Args:
      groups: a glob pattern of parameter names -> the algorithm for those parameters.
    """

    def __init__(self, groups: dict[str, SparsityAlgorithm] | None = None) -> None:
        super().__init__()
