"""Mixed precision: the half dtype, loss scaling and ``optimizer_step``."""

from ._grad_scaler import GradScaler as GradScaler
from ._optimizer_step import optimizer_step as optimizer_step
from .._precision import get_half_dtype as get_half_dtype
from .._precision import get_half_dtype_str as get_half_dtype_str
from .._precision import mixed_precision as mixed_precision
from .._precision import set_half_dtype as set_half_dtype
