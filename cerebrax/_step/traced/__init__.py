"""The traced step: ``@cstorch.trace`` turns a step function into one jitted program.

Its own folder above the core (:mod:`cerebrax._step`), because building the program
places state and inputs on the backend's wafer layout (:mod:`cerebrax.backend`,
:mod:`cerebrax.wse`), which themselves use the core. :mod:`cerebrax.trace` is its public
face; other folders import these names from here, never from ``_traced_step``.
"""

from ._traced_step import Retrace as Retrace
from ._traced_step import TracedStep as TracedStep
from ._traced_step import before_build as before_build
from ._traced_step import compile_step as compile_step
from ._traced_step import trace as trace
from ._traced_step import write_artifacts as write_artifacts

__all__ = ["Retrace", "TracedStep", "before_build", "compile_step", "trace", "write_artifacts"]
