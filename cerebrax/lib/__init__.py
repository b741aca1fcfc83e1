"""``cstorch.lib``: the wafer runtime's native library, of which cerebrax has the one
entry point that model code calls (:mod:`.cerebras_pytorch_lib`)."""

from . import cerebras_pytorch_lib as cerebras_pytorch_lib
