"""torch_bridge: a torch ``nn.Module`` as named JAX state and a pure JAX function.

``convert(module)`` exports the module with ``torch.export``, decomposes it to core ATen
and lowers every op with a registry of small JAX functions (``lowering``).
``model_adapter(module)`` plugs a module into ``cerebrax.compile``.
"""

from ._adapter import TorchModelAdapter as TorchModelAdapter
from ._adapter import model_adapter as model_adapter
from ._convert import Converted as Converted
from ._convert import convert as convert
from ._registry import lowered_ops as lowered_ops
from ._registry import lowering as lowering
