"""``cstorch.storage.constants``: the cstorch version recorded with checkpoints."""

from .._version import __version__ as _cerebrax_version

__all__ = ["__CSTORCH_VERSION__"]

__CSTORCH_VERSION__: str = f"cerebrax {_cerebrax_version}"
