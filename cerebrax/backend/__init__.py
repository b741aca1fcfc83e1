"""The process-wide backend, ``configure`` and the cluster configuration."""

from ._backend import Backend as Backend
from ._backend import RunConfig as RunConfig
from ._backend import backend as backend
from ._backend import configure as configure
from ._backend import current_backend as current_backend
from ._backend import get_or_create_backend as get_or_create_backend
from ._backend import reset as reset
from ._backend import run_config as run_config
from ..wse import EXECUTION_MODES as EXECUTION_MODES
from ..wse import ClusterConfig as ClusterConfig
