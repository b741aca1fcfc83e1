"""The worker server: DataLoader workers forked from the script's own process, taken
before JAX's runtime starts.

torch forks a DataLoader's worker processes from the running script, which costs a
fork: nothing is imported again. A process in which JAX's runtime runs must not be
forked (a lock one of its threads held stays locked forever in the child), so cerebrax
starts workers with multiprocessing's ``forkserver`` (:mod:`cerebrax.data`). Python's
own forkserver is a new interpreter that imports torch and the script's main module
(cerebrax and JAX with it) before it forks the first worker: seconds before the first
batch.

This server is instead a fork of the script's process, taken once, when the first
:class:`cerebrax.backend.Backend` is made: before JAX starts its runtime (a backend is
what starts it) and after the script's imports. It runs multiprocessing's own
forkserver loop in the forkserver's place, so every loader started with
``multiprocessing_context="forkserver"`` (cerebrax's choice where the user named none)
gets its workers from it, each for a fork and the unpickling of its dataset.

The workers see the script's main module as it was when the server was forked: the
classes, functions and other globals it had defined by then, the way Python's own
forkserver shows them the main module as imported (not as the script later changed
it). A dataset, ``collate_fn`` or ``worker_init_fn`` of the main module defined or
redefined after that point is reported before any worker starts
(:func:`stale_main_names`), with the fix.

It is taken only where it can help and is sound: a POSIX system with ``fork``, torch
imported (a torch DataLoader needs it), JAX's runtime not started yet, Python's
forkserver not running yet, this not a worker process, and ``CEREBRAX_WORKER_SERVER``
not ``0``. Otherwise Python's forkserver starts as before, at the first loader.
The server stops when the script and all of its workers have exited.
"""

from __future__ import annotations

import inspect
import multiprocessing
import os
import signal
import socket
import sys
import warnings
from multiprocessing import connection, forkserver, resource_tracker
from typing import Any

from ._runtime import RUNTIME

__all__ = ["running", "stale_main_names", "start"]

# What Python's forkserver singleton must look like for this server to take its place
# (the same in CPython 3.11 to 3.13); anything else keeps Python's own server.
_SERVER_FIELDS = ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid")
_MAIN_PARAMETERS = ("listener_fd", "alive_r", "preload")


def _jax_runtime_started() -> bool:
    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is None:
        return False
    started = getattr(bridge, "backends_are_initialized", None)
    return True if started is None else bool(started())


def _fits() -> bool:
    """Whether this process can take the server now (see the module's docstring)."""
    server = getattr(forkserver, "_forkserver", None)
    if (os.environ.get("CEREBRAX_WORKER_SERVER", "1") == "0" or not hasattr(os, "fork")
            or "forkserver" not in multiprocessing.get_all_start_methods()
            or "torch" not in sys.modules or multiprocessing.parent_process() is not None
            or server is None or _jax_runtime_started()):
        return False
    if any(not hasattr(server, name) for name in _SERVER_FIELDS) or any(
            name.startswith("_forkserver_") and name not in _SERVER_FIELDS
            for name in vars(server)):  # a newer protocol (an authentication key, ...)
        return False
    try:
        names = tuple(inspect.signature(forkserver.main).parameters)
    except (TypeError, ValueError):
        return False
    return names[:3] == _MAIN_PARAMETERS and server._forkserver_pid is None


def start() -> bool:
    """Forks the worker server now, where it fits (once per process); returns whether
    this process has one."""
    if RUNTIME.worker_server_main is not None:
        return True
    if RUNTIME.worker_server_tried:
        return False
    RUNTIME.worker_server_tried = True
    if not _fits():
        return False
    resource_tracker.ensure_running()  # shared by the workers, as with Python's server
    main = sys.modules.get("__main__")
    snapshot = dict(vars(main)) if main is not None else {}
    listener = socket.socket(socket.AF_UNIX)
    try:
        address = connection.arbitrary_address("AF_UNIX")
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        for stream in (sys.stdout, sys.stderr):  # or the server holds a copy of them
            if stream is not None:
                stream.flush()
        with warnings.catch_warnings():  # Python 3.12+ warns of any fork beside threads
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            _serve(listener, alive_r, alive_w)  # never returns
        os.close(alive_r)
    finally:
        listener.close()
    server = forkserver._forkserver
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid
    RUNTIME.worker_server_main = snapshot
    return True


def _serve(listener: socket.socket, alive_r: int, alive_w: int) -> None:
    """The server process: multiprocessing's forkserver loop, until the script and its
    workers are gone; it never returns into the script."""
    code = 1
    # A thread of the script blocked reading stdin held its lock at the fork, and no
    # longer exists here: closing that object (the forkserver loop closes stdin first)
    # would wait forever. It is kept, never closed, and stdin reads nothing instead.
    held_stdin = sys.stdin  # noqa: F841 - alive until os._exit, never closed
    sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115
    try:
        os.close(alive_w)
        # The script's own signal handlers (a checkpoint on SIGTERM, say) are not the
        # server's to run; Python's server starts with the defaults.
        for number in signal.valid_signals():
            try:
                handler = signal.getsignal(number)
            except (OSError, ValueError):
                continue
            if callable(handler) and handler is not signal.default_int_handler:
                signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        forkserver.main(listener.fileno(), alive_r, [])  # the script is imported already
        code = 0
    except SystemExit:
        code = 0
    except BaseException:  # noqa: BLE001 - reported; the process must not go back
        sys.excepthook(*sys.exc_info())
    finally:
        os._exit(code)


def running() -> bool:
    """Whether this process's workers come from the worker server."""
    return RUNTIME.worker_server_main is not None


def stale_main_names(objects: dict[str, Any]) -> list[str]:
    """Of ``objects`` (the main module's globals by name, as a dataset's pickle refers
    to them), the names the server's copy of the main module lacks or holds another
    object under: defined or redefined after the server was forked."""
    snapshot = RUNTIME.worker_server_main
    if snapshot is None:
        return []
    missing = object()
    return sorted(name for name, obj in objects.items()
                  if snapshot.get(name, missing) is not obj)
