"""The built-in lowerings, one module per op family (importing registers them)."""

from . import attention as attention
from . import conv as conv
from . import creation as creation
from . import elementwise as elementwise
from . import fft as fft
from . import grid as grid
from . import indexing as indexing
from . import linalg as linalg
from . import loss as loss
from . import norm as norm
from . import pool as pool
from . import random as random
from . import reductions as reductions
from . import rnn as rnn
from . import shape as shape
