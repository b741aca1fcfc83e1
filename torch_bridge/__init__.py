"""torch_bridge: a torch ``nn.Module`` as named JAX state and a pure JAX function.

``convert(module)`` exports the module with ``torch.export``, decomposes it to core ATen
and lowers every op with a registry of small JAX functions (``lowering``).
``cerebrax.compile`` runs torch modules through it (``cerebrax.models``); the bridge
itself depends only on cerebrax's bottom layer (``cerebrax.errors``, ``cerebrax._filters``).
"""

from ._convert import Converted as Converted
from ._convert import call_defaults as call_defaults
from ._convert import convert as convert
from ._convert import random_seed as random_seed
from ._autograd import honouring_functions as honouring_functions
from ._functions import keep_for_functions as keep_for_functions
from .ops._dtypes import export_dtype as export_dtype
from .ops._dtypes import to_jax as to_jax
from ._program import Program as Program
from ._side_calls import record_side_call as record_side_call
from ._tensor import JaxTensor as JaxTensor
from ._tensor import assign as assign
from ._tensor import detached_to_leaf as detached_to_leaf
from ._tensor import is_view as is_view
from ._tensor import on_backward as on_backward
from ._tensor import recording as recording
from ._tensor import stand_in as stand_in
from ._tensor import unwrap as unwrap
from .ops import lowered_ops as lowered_ops
from .ops.attention import lowering_platform as lowering_platform
from .ops import lowering as lowering
from .ops._util import torch_release as _torch_release


def _untested_torch(version: str) -> str | None:
    """What goes wrong with torch ``version``, where it is newer than the range the bridge
    is tested with (pyproject.toml: torch<2.15), else None."""
    if _torch_release(version) < (2, 15):
        return None
    return (
        f"torch_bridge is tested with torch 2.11 to 2.14, and torch {version} is installed. "
        "torch changes gradient rules and its autograd.Function machinery between releases "
        "(torch 2.14 changed clamp's gradient at a bound and at NaN, and made "
        "Function.apply C++), and cerebrax follows only the releases it was checked "
        "against: a model may train differently from torch eager without an error. "
        "Install torch<2.15 for results equal to torch eager.")


def _warn_on_untested_torch() -> None:
    import warnings

    import torch

    if message := _untested_torch(torch.__version__):
        warnings.warn(message, UserWarning, stacklevel=3)


_warn_on_untested_torch()
