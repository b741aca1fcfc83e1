"""cerebrax checkpoints: one H5 file per state dict, written atomically.

``save(state_dict, path)`` writes nested dicts, lists and tuples of jax, numpy and
torch arrays and Python scalars; ``load(path)`` reads them back without unpickling
anything; ``is_checkpoint(path)`` tells whether a file is a complete checkpoint.
"""

from ._h5 import FORMAT_VERSION as FORMAT_VERSION
from ._h5 import is_checkpoint as is_checkpoint
from ._h5 import load as load
from ._h5 import save as save
