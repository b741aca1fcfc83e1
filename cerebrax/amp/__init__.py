"""Mixed precision: the half dtype, autocast, loss scaling and ``optimizer_step``."""

from ._grad_scaler import GradScaler as GradScaler
from ._grad_scaler import isfinite as isfinite
from ._grad_scaler import update_if_finite as update_if_finite
from ._optimizer_step import optimizer_step as optimizer_step
from .._precision import autocast as autocast
from .._precision import enable_mixed_precision as enable_mixed_precision
from .._precision import get_floating_point_dtype as get_floating_point_dtype
from .._precision import get_floating_point_dtype_str as get_floating_point_dtype_str
from .._precision import get_half_dtype as get_half_dtype
from .._precision import get_half_dtype_str as get_half_dtype_str
from .._precision import is_cbfloat16_tensor as is_cbfloat16_tensor
from .._precision import mixed_precision as mixed_precision
from .._precision import round_to_cbfloat16 as round_to_cbfloat16
from .._precision import set_half_dtype as set_half_dtype
