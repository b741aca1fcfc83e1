"""``cstorch.storage``: settings of how checkpoints are written and read.

cerebrax's H5 checkpoints always hold their arrays' data in the file itself and read it
lazily on use (see :mod:`cerebrax.ckpt`), so these settings are accepted, recorded in
:data:`serializers.settings`, and change neither what a checkpoint holds nor what a load
returns.
"""

from . import constants as constants
from . import serializers as serializers

__all__ = ["constants", "serializers"]
