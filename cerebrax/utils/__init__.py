"""``cstorch.utils``: the data utilities live in ``cstorch.utils.data``."""

from . import data as data
