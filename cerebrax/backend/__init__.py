"""The process-wide backend, its device, ``configure``, the cluster configuration and
the ``cstorch.backends.csx`` flags."""

from ._backend import Backend as Backend
from ._backend import RunConfig as RunConfig
from ._backend import backend as backend
from ._backend import configure as configure
from ._backend import current_backend as current_backend
from ._backend import current_torch_device as current_torch_device
from ._backend import get_or_create_backend as get_or_create_backend
from ._backend import reset as reset
from ._backend import run_config as run_config
from ._backend import use_cs as use_cs
from ._types import BackendType as BackendType
from ._types import current_backend_impl as current_backend_impl
from ._types import get_backend_args as get_backend_args
from . import ltc_backend as ltc_backend
from ._debug_args import DebugArgs as DebugArgs
from ._device import BackendDevice as BackendDevice
from ._device import hand_over as hand_over
from ._device import is_handed_over as is_handed_over
from ._device import materialize as materialize
from ._flags import backends as backends
from ._flags import flags_report as flags_report
from ._helpers import from_numpy as from_numpy
from ._helpers import full as full
from ._helpers import full_like as full_like
from ._helpers import make_constant as make_constant
from ._helpers import name_scope as name_scope
from ._helpers import ones as ones
from ._helpers import ones_like as ones_like
from ._helpers import to_numpy as to_numpy
from ._helpers import zeros as zeros
from ._helpers import zeros_like as zeros_like
from ..wse import EXECUTION_MODES as EXECUTION_MODES
from ..wse import ClusterConfig as ClusterConfig
