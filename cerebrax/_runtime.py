"""The process-wide state of cerebrax, in one object: :data:`RUNTIME`.

Everything cerebrax remembers between calls, besides what users hold themselves
(models, optimizers, steps), is a field of :class:`Runtime`, read top to bottom here.
Each field names the module that owns it; other modules reach it through that module's
public functions. :meth:`Runtime.reset` (``cstorch.reset()``) returns the process to
its state at import (except that the cstorch alias, once on, stays on): no backend, no registered state, no queued closures, no streams.

This module is the bottom layer with :mod:`cerebrax.errors`: it imports no other
cerebrax module, and its fields hold plain containers.
"""

from __future__ import annotations

import collections
import dataclasses
import weakref
from typing import Any

__all__ = ["RUNTIME", "Runtime", "WeakIdentityMap"]


class WeakIdentityMap:
    """A mapping keyed by object identity that forgets a key when the key dies.

    ``weakref.WeakKeyDictionary`` compares keys with ``==``, which for tensors is
    elementwise; this map compares with ``is``.
    """

    def __init__(self) -> None:
        self._items: dict[int, tuple[weakref.ref, Any]] = {}

    def __setitem__(self, key: Any, value: Any) -> None:
        ident = id(key)

        def forget(_: weakref.ref, items: dict = self._items) -> None:
            entry = items.get(ident)
            if entry is not None and entry[0]() is None:
                del items[ident]

        self._items[ident] = (weakref.ref(key, forget), value)

    def get(self, key: Any, default: Any = None) -> Any:
        entry = self._items.get(id(key))
        return entry[1] if entry is not None and entry[0]() is key else default

    def items(self) -> list[tuple[Any, Any]]:
        """The live ``(key, value)`` pairs."""
        pairs = [(ref(), value) for ref, value in list(self._items.values())]
        return [(key, value) for key, value in pairs if key is not None]

    def __len__(self) -> int:
        return len(self.items())


@dataclasses.dataclass
class Runtime:
    """The process-wide state. One instance, :data:`RUNTIME`; see the module docs."""

    # ---- the backend (cerebrax.backend) ----------------------------------------------
    backend: Any = None                   # the Backend of this process, or None
    run_config: Any = None                # what cstorch.configure() was given, or None
    csx_flags: dict = dataclasses.field(default_factory=dict)  # cstorch.backends.csx.*
    # ---- registered state (cerebrax._state) ------------------------------------------
    generation: int = 0                   # bumped by reset(): older state is dropped
    state_device: Any = None              # where new state slots live (the backend's)
    slots: dict = dataclasses.field(default_factory=dict)       # index -> weakref(StateRef)
    optimizers: dict = dataclasses.field(default_factory=dict)  # index -> weakref(optimizer)
    trace_contexts: list = dataclasses.field(default_factory=list)  # innermost last
    # ---- step closures (cerebrax._closures) ------------------------------------------
    closures: collections.deque = dataclasses.field(default_factory=collections.deque)
    dispatches: int = 0                   # traced steps dispatched so far
    last_outputs: list = dataclasses.field(default_factory=list)  # of the last step
    running_closure: Any = None           # the closure entry running now
    executors: list = dataclasses.field(default_factory=list)    # DataExecutor loops
    # ---- model wrapping (cerebrax.models) --------------------------------------------
    # an original parameter object (a torch nn.Parameter) -> its compiled Parameter
    parameter_aliases: WeakIdentityMap = dataclasses.field(default_factory=WeakIdentityMap)
    # while a step is traced: compiled Parameter -> the torch tensor torch code sees
    # for it (cerebrax._torch_parameters)
    torch_views: dict = dataclasses.field(default_factory=dict)
    # ---- mixed precision (cerebrax._precision) ---------------------------------------
    half_dtype: str | None = None         # set_half_dtype's choice; None: float16
    mixed_precision: bool | None = None   # enable_mixed_precision's; None: the backend's
    # ---- data streaming (cerebrax.data) ----------------------------------------------
    streams: weakref.WeakSet = dataclasses.field(default_factory=weakref.WeakSet)
    # a JAX array a stream made from a torch tensor -> that tensor's torch dtype
    torch_origins: WeakIdentityMap = dataclasses.field(default_factory=WeakIdentityMap)
    # ---- 1.2-era sessions (cerebrax.legacy) ------------------------------------------
    sessions: list = dataclasses.field(default_factory=list)    # innermost last
    # ---- running cstorch code (cerebrax._cstorch_alias) ------------------------------
    cstorch_alias: bool = False           # enable_cstorch_alias() ran; kept by reset()

    def reset(self) -> None:
        """Stops every stream and forgets everything above; bumps :attr:`generation`."""
        for stream in list(self.streams):
            stream.close()
        fresh = Runtime(generation=self.generation + 1, cstorch_alias=self.cstorch_alias)
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(fresh, field.name))


RUNTIME = Runtime()
