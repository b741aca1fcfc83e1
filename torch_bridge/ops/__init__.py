"""The lowering registry and the built-in lowerings, one module per op family.

Importing this package registers the built-in lowerings; ``lowering`` registers more.
"""

from ._registry import is_random as is_random
from ._registry import lookup as lookup
from ._registry import lowered_ops as lowered_ops
from ._registry import lowering as lowering

from . import attention as attention
from . import backward as backward
from . import conv as conv
from . import creation as creation
from . import elementwise as elementwise
from . import fft as fft
from . import grid as grid
from . import indexing as indexing
from . import linalg as linalg
from . import loss as loss
from . import minmax as minmax
from . import norm as norm
from . import pool as pool
from . import random as random
from . import reductions as reductions
from . import rnn as rnn
from . import shape as shape
