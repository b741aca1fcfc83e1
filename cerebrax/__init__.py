"""cerebrax: the Cerebras PyTorch API (cstorch) on JAX.

``import cerebrax as cstorch``, then port a cstorch training script: compile the model,
build an optimizer and a scheduler, decorate the step with ``@cstorch.trace``, read
values in step closures, save H5 checkpoints. The whole step runs as one ``jax.jit``
program on a CPU, on an emulated wafer of devices, or on GPUs/TPUs.
"""

import os as _os
import sys as _sys

from . import _startup_gc

# `cerebrax run` (`python -m cerebrax run`, where argv[0] is "-m" while the package is
# imported, or the console script): the collector is held from the launch, JAX's and
# cerebrax's imports below included (see cerebrax/_startup_gc.py).
if _sys.argv[1:2] == ["run"] and _os.path.basename(_sys.argv[0]) in ("-m", "cerebrax"):
    _startup_gc.hold()

from . import amp as amp  # noqa: E402 - after the hold
from . import cirh as cirh
from . import ckpt as ckpt
from . import core as core
from . import data as data
from . import distributed as distributed
from . import errors as errors
from . import estimator as estimator
from . import experimental as experimental
from . import legacy as legacy
from . import lib as lib
from . import metrics as metrics
from . import models as models
from . import nn as nn
from . import optim as optim
from . import profiler as profiler
from . import schedules as schedules
from . import sparse as sparse
from . import storage as storage
from . import summaries as summaries
from . import utils as utils
from . import wse as wse
from ._debug_names import add_debug_name as add_debug_name
from ._debug_names import get_debug_name as get_debug_name
from ._cstorch_alias import enable_cstorch_alias as enable_cstorch_alias
from ._step import Parameter as Parameter
from ._step import checkpoint_closure as checkpoint_closure
from ._step import step_closure as step_closure
from ._version import __version__ as __version__
from .amp import set_half_dtype as set_half_dtype
from .backend import Backend as Backend
from .backend import backend as backend
from .backend import backends as backends
from .backend import configure as configure
from .backend import current_backend as current_backend
from .backend import current_torch_device as current_torch_device
from .backend import from_numpy as from_numpy
from .backend import full as full
from .backend import full_like as full_like
from .backend import make_constant as make_constant
from .backend import name_scope as name_scope
from .backend import ones as ones
from .backend import ones_like as ones_like
from .backend import reset as reset
from .backend import to_numpy as to_numpy
from .backend import use_cs as use_cs
from .backend import zeros as zeros
from .backend import zeros_like as zeros_like
from .models import CompiledModel as CompiledModel
from .models import FunctionalModel as FunctionalModel
from .models import ModelAdapter as ModelAdapter
from .models import compile as compile  # noqa: A004
from .models import register_model_adapter as register_model_adapter
from .ckpt import load as load
from .core.annotation import current_pol as current_pol
from .core.annotation import pol as pol
from .ckpt import save as save
from .data import current_executor as current_executor
from .errors import BackendError as BackendError
from .errors import CerebraxError as CerebraxError
from .errors import CheckpointError as CheckpointError
from .errors import ConfigError as ConfigError
from .errors import RecompileError as RecompileError
from .errors import StateError as StateError
from .errors import SummaryError as SummaryError
from .errors import TensorReadError as TensorReadError
from .errors import UnsupportedOpError as UnsupportedOpError
from .summaries import summarize_scalar as summarize_scalar
from .summaries import summarize_tensor as summarize_tensor
from .trace import DeferredValue as DeferredValue
from .trace import TracedStep as TracedStep
from .trace import backward as backward
from .trace import compile_step as compile_step
from .trace import trace as trace

_generating_docs = False  # cstorch sets it while its documentation is built; never here
