"""The process-wide state of cerebrax, in one object: :data:`RUNTIME`.

Everything cerebrax remembers between calls, besides what users hold themselves
(models, optimizers, steps), is a field of :class:`Runtime`, read top to bottom here.
Each field names the module that owns it; other modules reach it through that module's
public functions. :meth:`Runtime.reset` (``cstorch.reset()``) returns the process to
its state at import: no backend, no registered state, no queued closures, no streams.
It keeps the fields of the last section, each marked ``kept`` with its reason: wiring
that modules install once, and what cerebrax attached to the user's own objects or to
open files, which outlive a generation of state.
tests/test_layering.py checks that no other module-level name of cerebrax or torch_bridge
changes at run time, except the few it lists with their reasons.

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

    def pop(self, key: Any, default: Any = None) -> Any:
        """Forgets ``key``; returns its value (``default`` where it had none)."""
        found = self.get(key, self)
        if found is self:
            return default
        del self._items[id(key)]
        return found

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
    # ---- registered state (cerebrax._step) -------------------------------------------
    generation: int = 0                   # bumped by reset(): older state is dropped
    state_device: Any = None              # where new state slots live (the backend's)
    slots: dict = dataclasses.field(default_factory=dict)       # index -> weakref(StateRef)
    optimizers: dict = dataclasses.field(default_factory=dict)  # index -> weakref(optimizer)
    trace_contexts: list = dataclasses.field(default_factory=list)  # innermost last
    # an object of the user's model (a torch nn.Parameter) -> the compiled Parameter it
    # stands for, linked by compile() through cerebrax._step.alias_parameter; the link
    # keeps that Parameter (and its compiled model) alive while the object lives
    parameter_aliases: WeakIdentityMap = dataclasses.field(default_factory=WeakIdentityMap)
    # while a step is traced: compiled Parameter -> the torch tensor torch code sees
    # for it (cerebrax._step's torch parameters)
    torch_views: dict = dataclasses.field(default_factory=dict)
    # ---- step closures (cerebrax._step) ----------------------------------------------
    closures: collections.deque = dataclasses.field(default_factory=collections.deque)
    dispatches: int = 0                   # traced steps dispatched so far
    last_outputs: list = dataclasses.field(default_factory=list)  # of the last step
    running_closure: Any = None           # the closure entry running now
    executors: list = dataclasses.field(default_factory=list)    # DataExecutor loops
    # ---- mixed precision (cerebrax._precision) ---------------------------------------
    half_dtype: str | None = None         # set_half_dtype's choice; None: float16
    mixed_precision: bool | None = None   # enable_mixed_precision's; None: the backend's
    # ---- data streaming (cerebrax.data) ----------------------------------------------
    streams: weakref.WeakSet = dataclasses.field(default_factory=weakref.WeakSet)
    # a JAX array a stream made from a torch tensor -> that tensor's torch dtype
    torch_origins: WeakIdentityMap = dataclasses.field(default_factory=WeakIdentityMap)
    # ---- 1.2-era sessions (cerebrax.legacy) ------------------------------------------
    sessions: list = dataclasses.field(default_factory=list)    # innermost last
    # ---- metrics (cerebrax.metrics) --------------------------------------------------
    metrics: weakref.WeakValueDictionary = dataclasses.field(  # name -> live metric
        default_factory=weakref.WeakValueDictionary)
    # ---- annotations (cerebrax.core.annotation, cerebrax.lib) ------------------------
    annotations: list = dataclasses.field(default_factory=list)  # applied, oldest first
    tensor_attributes: list = dataclasses.field(default_factory=list)  # set_attribute's
    # ---- names and warnings (cerebrax._debug_names, each warning's module) -----------
    # a torch module -> the name add_debug_name() gave it
    debug_names: WeakIdentityMap = dataclasses.field(default_factory=WeakIdentityMap)
    warned: dict = dataclasses.field(default_factory=dict)  # key -> what was warned of

    # ==== kept by reset() ===============================================================
    # running cstorch code (cerebrax._cstorch_alias): enable_cstorch_alias() ran. Kept:
    # the alias's modules stay installed.
    cstorch_alias: bool = dataclasses.field(default=False, metadata={"kept": True})
    # Wiring that modules install once, each at its import or first use. Kept: the
    # modules are not imported or used for the first time again.
    # Checks run before every read of a slot outside a traced step (cerebrax._step).
    read_guards: list = dataclasses.field(default_factory=list, metadata={"kept": True})
    # What runs before the first step is built (cerebrax.trace's before_build).
    build_hooks: list = dataclasses.field(default_factory=list, metadata={"kept": True})
    # (predicate, factory) of compile()'s model adapters, first match wins
    # (cerebrax.models).
    model_adapters: list = dataclasses.field(default_factory=list,
                                             metadata={"kept": True})
    # The handle of torch's global optimizer step pre-hook once installed, else None
    # (cerebrax.optim).
    torch_step_hook: Any = dataclasses.field(default=None, metadata={"kept": True})
    # What cerebrax attached to the user's own objects and to open files. Kept: those
    # objects live on, and the attachments must stay consistent with them.
    # A torch module -> the handles of the hooks compile() installed on it
    # (cerebrax.models), removed when the module is compiled again.
    torch_hook_handles: WeakIdentityMap = dataclasses.field(
        default_factory=WeakIdentityMap, metadata={"kept": True})
    # The checkpoint files that loaded arrays still read from (cerebrax.ckpt), read
    # into memory before a save overwrites one.
    open_checkpoints: weakref.WeakSet = dataclasses.field(default_factory=weakref.WeakSet,
                                                          metadata={"kept": True})
    # torch DataLoaders whose start method cerebrax chose, those of them checked to
    # pickle, the worker iterators it started (shut down at exit), and whether the
    # forkserver's preload list is set (cerebrax.data).
    safe_loaders: weakref.WeakSet = dataclasses.field(default_factory=weakref.WeakSet,
                                                      metadata={"kept": True})
    pickle_checked: weakref.WeakSet = dataclasses.field(default_factory=weakref.WeakSet,
                                                        metadata={"kept": True})
    worker_iterators: weakref.WeakSet = dataclasses.field(default_factory=weakref.WeakSet,
                                                          metadata={"kept": True})
    forkserver_preloaded: bool = dataclasses.field(default=False, metadata={"kept": True})
    # Where exported torch graphs are kept across processes (torch_bridge's export
    # cache), set with JAX's compilation cache (cerebrax.backend), else None. Kept: JAX
    # has one compilation cache per process, and this folder goes with it.
    export_cache_dir: str | None = dataclasses.field(default=None, metadata={"kept": True})
    # The worker server (cerebrax._fork_server): whether this process tried to fork it,
    # and once forked, the main module's globals as the server holds them. Kept: the
    # server lives as long as the process.
    worker_server_tried: bool = dataclasses.field(default=False, metadata={"kept": True})
    worker_server_main: dict | None = dataclasses.field(default=None,
                                                        metadata={"kept": True})
    # The garbage collector's start-up hold (cerebrax._startup_gc): whether this process
    # took it, and while held, the thresholds before it and those it set. Kept: it is
    # taken once per process and ends with the first step.
    startup_gc_used: bool = dataclasses.field(default=False, metadata={"kept": True})
    startup_gc_thresholds: tuple | None = dataclasses.field(default=None,
                                                            metadata={"kept": True})
    # Whether torch's Dynamo-disabled kernels have their stand-ins (torch_bridge's
    # _lazy_dynamo). Kept: the stand-ins stay on torch's functions.
    dynamo_deferred: bool = dataclasses.field(default=False, metadata={"kept": True})
    # What open with-blocks (and decorated calls) pushed, innermost last. Kept: each
    # block takes its own entry off again, also where it ran a reset().
    # The precision optimization levels of the running pol(level=...) regions
    # (cerebrax.core.annotation).
    pol_levels: list = dataclasses.field(default_factory=list, metadata={"kept": True})
    # The lists of the open recording_schedule() blocks (cerebrax.wse).
    schedule_records: list = dataclasses.field(default_factory=list,
                                               metadata={"kept": True})
    # The torch bridge (torch_bridge). Kept: exported graphs hold indices into the
    # calls, and the patches and recorders belong to the blocks that opened them.
    # The Python objects (a Function class, a hook) that exported graphs call by index,
    # and the index of each hashable key registered.
    bridge_calls: list = dataclasses.field(default_factory=list, metadata={"kept": True})
    bridge_call_keys: dict = dataclasses.field(default_factory=dict,
                                               metadata={"kept": True})
    # What a custom Function's apply captures of the state outside the tensors.
    bridge_keepers: list = dataclasses.field(default_factory=list, metadata={"kept": True})
    # The blocks inside honouring_functions() in all threads (torch's classes are
    # patched while there is one), and the (class, name, its own or None) patched.
    bridge_patch_users: int = dataclasses.field(default=0, metadata={"kept": True})
    bridge_patches: list = dataclasses.field(default_factory=list, metadata={"kept": True})
    # The open recorders of created JaxTensors, and the backward handlers, innermost
    # last.
    bridge_recorders: list = dataclasses.field(default_factory=list,
                                               metadata={"kept": True})
    bridge_backward: list = dataclasses.field(default_factory=list, metadata={"kept": True})
    # The threads running torch_bridge's direct traces (torch_bridge._direct), one entry
    # per open trace.
    bridge_direct: list = dataclasses.field(default_factory=list, metadata={"kept": True})

    def reset(self) -> None:
        """Stops every stream and forgets every field above the kept ones; bumps
        :attr:`generation`."""
        for stream in list(self.streams):
            stream.close()
        fresh = Runtime(generation=self.generation + 1)
        for field in dataclasses.fields(self):
            if not field.metadata.get("kept"):
                setattr(self, field.name, getattr(fresh, field.name))


RUNTIME = Runtime()
