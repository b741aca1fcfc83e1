"""``cstorch.core``: the annotations that steer the wafer's compiler (:mod:`.annotation`)."""

from . import annotation as annotation
