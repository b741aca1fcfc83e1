"""The traced step's core: what a step's program is made of, below everything that uses it.

cstorch code is imperative and JAX code is functional; this folder holds the pieces that
join them. Its modules, bottom first (each imports only those before it):

- ``_active_context``: :func:`active_context`, the trace context of the step being traced
  (None outside one), and :class:`ActiveContext`, everything the rest of cerebrax may ask
  of it;
- ``_interop``: torch tensors <-> JAX arrays (:func:`as_jax`, :func:`to_torch`, ...);
- ``_state``: registered state (:class:`StateRef`, :class:`Parameter`), the live
  optimizers, and the user's objects that compiled parameters stand for
  (:func:`alias_parameter`);
- ``_closures``: a step closure's whole life (:func:`step_closure`, :func:`drain`, ...);
- ``_grad_regions`` and ``_torch_parameters``: ``torch.autograd.grad`` in a step, and torch
  code reading a compiled module's torch parameters (the latter imported only with torch);
- ``_trace_context``: :class:`TraceContext`, where a traced step's reads and writes go,
  and the deferred backward (:func:`backward`, :func:`deferrable`).

``traced/`` is the traced step itself (:class:`~cerebrax._step.traced.TracedStep`), a folder
of its own in a higher layer: it builds the program on the wafer's layout, so it uses the
backend, which uses this core. The public names are ``cerebrax.trace``'s.

Other folders import these names from here, never from the modules
(tests/test_layering.py checks it).
"""

from ._active_context import ActiveContext as ActiveContext
from ._active_context import active_context as active_context
from ._active_context import tracing as tracing
from ._closures import ClosureCall as ClosureCall
from ._closures import after_dispatch as after_dispatch
from ._closures import checkpoint_closure as checkpoint_closure
from ._closures import current_executor as current_executor
from ._closures import drain as drain
from ._closures import executor_scope as executor_scope
from ._closures import record_closure as record_closure
from ._closures import running_step as running_step
from ._closures import step_closure as step_closure
from ._interop import as_jax as as_jax
from ._interop import mark_torch_origin as mark_torch_origin
from ._interop import to_numpy as to_numpy
from ._interop import to_torch as to_torch
from ._interop import torch_leaves_to_jax as torch_leaves_to_jax
from ._interop import torch_origin as torch_origin
from ._interop import torch_to_jax as torch_to_jax
from ._state import Parameter as Parameter
from ._state import StateRef as StateRef
from ._state import alias_parameter as alias_parameter
from ._state import aliased_parameter as aliased_parameter
from ._state import constant_on_host as constant_on_host
from ._state import current_generation as current_generation
from ._state import live_optimizers as live_optimizers
from ._state import live_refs as live_refs
from ._state import optimized_parameters as optimized_parameters
from ._state import parameter_aliases as parameter_aliases
from ._state import parameter_hooks as parameter_hooks
from ._state import register_optimizer as register_optimizer
from ._state import set_state_device as set_state_device
from ._trace_context import DeferredValue as DeferredValue
from ._trace_context import StepRecord as StepRecord
from ._trace_context import TraceContext as TraceContext
from ._trace_context import backward as backward
from ._trace_context import context_with_grads as context_with_grads
from ._trace_context import deferrable as deferrable
from ._trace_context import deferrable_function as deferrable_function
from ._trace_context import with_jax_gradients as with_jax_gradients

__all__ = [
    # the active trace context
    "ActiveContext", "active_context", "tracing",
    # torch <-> JAX
    "as_jax", "mark_torch_origin", "to_numpy", "to_torch", "torch_leaves_to_jax",
    "torch_origin", "torch_to_jax",
    # registered state
    "Parameter", "StateRef", "alias_parameter", "aliased_parameter", "constant_on_host",
    "current_generation", "live_optimizers", "live_refs", "optimized_parameters",
    "parameter_aliases", "parameter_hooks", "register_optimizer", "set_state_device",
    # step closures
    "ClosureCall", "after_dispatch", "checkpoint_closure", "current_executor", "drain",
    "executor_scope", "record_closure", "running_step", "step_closure",
    # the trace context and the deferred backward
    "DeferredValue", "StepRecord", "TraceContext", "backward", "context_with_grads",
    "deferrable", "deferrable_function", "with_jax_gradients",
]
