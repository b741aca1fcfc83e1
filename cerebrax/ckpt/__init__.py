"""cerebrax checkpoints: one H5 file per state dict, written atomically, read lazily.

``save(state_dict, path)`` writes nested dicts, lists and tuples of jax, numpy and
torch arrays and Python scalars; ``load(path)`` reads them back without unpickling
anything, each array as a :class:`LazyArray` read on use; ``is_checkpoint(path)``
tells whether a file is a complete checkpoint. ``save(..., background=True)`` copies
the arrays to host memory and writes the file in a background thread; it returns a
:class:`SaveHandle`, and ``wait()`` waits for the pending background save.
``convert_torch_to_h5`` and ``convert_h5_to_torch`` (also ``python -m cerebrax.ckpt
to-h5|to-torch SRC DST``) move state dicts between this format and torch ``.pt`` files.
"""

from ._background import SaveHandle as SaveHandle
from ._background import wait as wait
from ._format import FORMAT_VERSION as FORMAT_VERSION
from ._lazy import LazyArray as LazyArray
from ._lazy import to_torch as to_torch
from ._load import is_checkpoint as is_checkpoint
from ._load import load as load
from ._save import clean_temporary_files as clean_temporary_files
from ._save import save as save
from ._torch import convert_h5_to_torch as convert_h5_to_torch
from ._torch import convert_torch_to_h5 as convert_torch_to_h5
