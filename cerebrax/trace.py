"""The static-graph step: ``@cstorch.trace`` turns a training step into one jitted program.

The step's Python runs once, at the first call, and becomes ONE ``jax.jit`` program
over all registered state, ``(all state, step inputs) -> (new state, step outputs,
closure arguments)``: forward, backward and optimizer update fused, the old state's
buffers donated. ``cstorch.backward(loss)`` marks the loss; the calls that consume
gradients are recorded and replayed in program order once the gradients exist.

This module holds cstorch's names for it; the implementation is the private folder
``cerebrax._step`` (its ``traced`` part builds, checks and calls the program).
"""

from ._step import DeferredValue as DeferredValue
from ._step import backward as backward
from ._step.traced import Retrace as Retrace
from ._step.traced import TracedStep as TracedStep
from ._step.traced import before_build as before_build
from ._step.traced import compile_step as compile_step
from ._step.traced import trace as trace
from ._step.traced import write_artifacts as write_artifacts

__all__ = ["DeferredValue", "Retrace", "TracedStep", "backward", "before_build",
           "compile_step", "trace", "write_artifacts"]
