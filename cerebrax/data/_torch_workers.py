"""Worker processes of torch DataLoaders, started safely beside JAX's threads.

A torch ``DataLoader`` with ``num_workers > 0`` starts its worker processes with the
platform's default start method, ``fork`` on Linux. Forking a process that runs JAX
copies it mid-flight: JAX's runtime threads do not exist in the child, and a lock one
of them held stays locked there forever, so a worker can deadlock (JAX warns on every
``os.fork()``: "JAX is multithreaded, so this will likely lead to a deadlock").

When such a loader reaches cerebrax (returned by a DataLoader's ``input_fn``, or timed
by ``benchmark_dataloader``) and its user chose no ``multiprocessing_context``,
cerebrax chooses ``forkserver`` (``spawn`` where there is none): the workers are then
forked from a clean server process that never ran JAX, or started fresh. Both send the
dataset, ``collate_fn`` and ``worker_init_fn`` to the workers by pickling, so those must
be importable objects (defined at module level); a failure names the fix. A start
method the user set is kept as it is.

Start-up cost. Where it could, cerebrax forked a worker server from the script's
process when the first backend was made, before JAX's runtime started
(:mod:`cerebrax._fork_server`): it takes the forkserver's place, and a worker then
costs a fork and the unpickling of its dataset, as torch's own forked workers do. The
workers see the main module as the server holds it, so a dataset class (or
``collate_fn``, ``worker_init_fn``) the main module defines or redefines after that
point is a ConfigError before any worker starts. Elsewhere Python's forkserver is a
new interpreter; the first time cerebrax chooses ``forkserver`` it asks that server to
import torch before it forks any worker (``set_forkserver_preload(["__main__",
"torch"])``), so that workers do not import torch each.
Loaders that restart their workers every epoch can keep them with
``persistent_workers=True``.
"""

from __future__ import annotations

import atexit
import io
import multiprocessing
import pickle
import sys
import types
from collections.abc import Iterator
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np

from .. import _fork_server
from .._filters import is_torch_tensor
from .._runtime import RUNTIME
from ..errors import ConfigError

__all__ = ["SAFE_START_METHOD", "is_torch_dataloader", "safe_iter", "shutdown_workers",
           "use_safe_start_method"]

SAFE_START_METHOD = (
    "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
)

_PRELOAD = ["__main__", "torch"]  # what the forkserver imports before it forks workers

MSG_PICKLE = """\
The torch DataLoader uses num_workers={workers}. Beside JAX, cerebrax starts its worker
processes with multiprocessing_context={method!r} (a forked copy of a process running
JAX's threads can deadlock), and that start method sends the dataset, collate_fn and
worker_init_fn to each worker by pickling them; pickling the {part} failed:
    {error}
Fix, one of:
  - define the dataset class, collate_fn and worker_init_fn at module level of an
    importable module (not inside a function, not as a lambda), and keep the script's
    training code under `if __name__ == "__main__":` (the workers import the main module);
  - load in the main process: num_workers=0;
  - choose the start method yourself: DataLoader(..., multiprocessing_context="fork")
    keeps unpicklable objects working, at the risk of a deadlocked worker."""


def is_torch_dataloader(obj: Any) -> bool:
    """Whether ``obj`` is a ``torch.utils.data.DataLoader`` (checked without importing torch)."""
    return any(c.__name__ == "DataLoader" and c.__module__ == "torch.utils.data.dataloader"
               for c in type(obj).__mro__)


def use_safe_start_method(loader: Any) -> Any:
    """Gives a multi-worker torch ``loader`` without a start method :data:`SAFE_START_METHOD`.

    Returns ``loader`` itself; any other object is returned untouched.
    """
    if (is_torch_dataloader(loader) and loader.num_workers > 0
            and loader.multiprocessing_context is None):
        if SAFE_START_METHOD == "forkserver" and not RUNTIME.forkserver_preloaded:
            # Takes effect if the server has not started yet (it starts with the first
            # forkserver process of this Python process).
            multiprocessing.get_context("forkserver").set_forkserver_preload(_PRELOAD)
            RUNTIME.forkserver_preloaded = True
        loader.multiprocessing_context = SAFE_START_METHOD
        RUNTIME.safe_loaders.add(loader)
    return loader


MSG_STALE_MAIN = """\
The torch DataLoader uses num_workers={workers}. cerebrax forks its worker processes
from a copy of the script taken when the backend was made, before JAX's runtime
started, and in that copy the script's main module lacks {names} (defined or redefined
after the backend was made), which the workers need to unpickle the {part}.
Fix, one of:
  - define {names} before the backend is made (cstorch.backend(...), or the first
    cstorch.compile), at the top of the script, with the training code under
    `if __name__ == "__main__":`;
  - define {names} in a module of its own and import it;
  - load in the main process: num_workers=0."""


class _Probe(ForkingPickler):
    """Pickles an object graph the way the workers receive it, skipping array data
    (tensors and numpy arrays are sent through shared memory, and cost nothing here),
    and records the main module's globals it refers to by name (``main_refs``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.main_refs: dict[str, Any] = {}

    def persistent_id(self, obj: Any) -> Any:
        if is_torch_tensor(obj) or isinstance(obj, np.ndarray):
            return id(obj)
        return None

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType)) and getattr(
                obj, "__module__", None) == "__main__":
            qualname = getattr(obj, "__qualname__", None)
            main = sys.modules.get("__main__")
            if isinstance(qualname, str) and main is not None:
                top = qualname.split(".")[0]
                self.main_refs[top] = getattr(main, top, None)
        return NotImplemented


def _check_picklable(loader: Any) -> None:
    """Raises the ConfigError of :data:`MSG_PICKLE` if the workers' share of ``loader``
    cannot be pickled (checked once per loader, before any worker starts)."""
    if loader in RUNTIME.pickle_checked:
        return
    parts = {"dataset": loader.dataset, "collate_fn": loader.collate_fn,
             "worker_init_fn": loader.worker_init_fn}
    for part, obj in parts.items():
        probe = _Probe(io.BytesIO(), pickle.HIGHEST_PROTOCOL)
        try:
            probe.dump(obj)
        except Exception as error:  # noqa: BLE001 - any failure to pickle stops the workers
            raise ConfigError(MSG_PICKLE.format(
                workers=loader.num_workers, method=SAFE_START_METHOD, part=part,
                error=f"{type(error).__name__}: {error}")) from error
        stale = _fork_server.stale_main_names(probe.main_refs)
        if stale:
            raise ConfigError(MSG_STALE_MAIN.format(
                workers=loader.num_workers, names=", ".join(stale), part=part))
    RUNTIME.pickle_checked.add(loader)


def safe_iter(source: Any) -> Iterator[Any]:
    """``iter(source)``, with a safe start method for a multi-worker torch DataLoader.

    Raises:
      ConfigError: the workers could not be started because the dataset (or its
        collate_fn, worker_init_fn) cannot be pickled, with the ways to fix it.
    """
    use_safe_start_method(source)
    if not (is_torch_dataloader(source) and source in RUNTIME.safe_loaders):
        return iter(source)
    _check_picklable(source)
    iterator = iter(source)
    if not RUNTIME.worker_iterators:
        atexit.register(shutdown_workers)  # runs before multiprocessing's own exit hook
    RUNTIME.worker_iterators.add(iterator)
    return iterator


def shutdown_workers() -> None:
    """Stops the worker processes of every torch DataLoader iterator :func:`safe_iter`
    started that is still alive (cerebrax calls it at interpreter exit).

    A loader kept alive to the end (``persistent_workers=True`` keeps its iterator on
    the loader) would otherwise stop its workers only in its ``__del__`` during the
    interpreter's teardown, after multiprocessing's exit hook has closed the queues that
    carry the stop message: each worker then waits out torch's 5 s timeout before it is
    killed, and the script hangs for seconds after its last step.
    """
    for iterator in list(RUNTIME.worker_iterators):
        stop = getattr(iterator, "_shutdown_workers", None)
        if stop is not None:
            stop()
    RUNTIME.worker_iterators.clear()
