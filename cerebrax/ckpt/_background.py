"""Background saves: one writer thread at a time, and errors that are never lost.

A background save hands the writing of its file to a thread and returns a
:class:`SaveHandle`. At most one background save is pending: every save first
waits for the pending one. A failed write is raised once to the caller: by the
handle's ``wait``, by :func:`wait`, by the next save, or, if none of these came,
when the interpreter exits (as an exception Python prints from an ``atexit``
hook; the exit status stays what the program set).
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable

from cerebrax.errors import CheckpointError


# How long wait() gives a writer thread whose start a Ctrl-C interrupted to show that
# it exists (it does within milliseconds when it does).
_START_TIMEOUT = 10.0


class SaveHandle:
    """A checkpoint being written in the background by ``save(..., background=True)``.

    Example:
      >>> import numpy as np, cerebrax.ckpt as ckpt
      >>> handle = ckpt.save({"w": np.ones(2)}, "/tmp/handle_doc.h5", background=True)
      >>> handle.wait()  # the file is complete and durable now
      >>> handle.done(), handle.path
      (True, '/tmp/handle_doc.h5')
    """

    def __init__(self, path: str, write: Callable[[], None]) -> None:
        self.path = path  # the absolute path of the checkpoint
        self._write = write
        self._error: BaseException | None = None
        self._reported = False
        self._thread = threading.Thread(target=self._run, name="cerebrax-save")
        self._began = threading.Event()
        self._ended = threading.Event()
        # True until the writer thread has surely started: a Ctrl-C (KeyboardInterrupt)
        # in the main thread can land inside Thread.start(), before or after the thread
        # came to exist; wait() then finds out which (see _wait_ended).
        self._starting = True

    def _start(self) -> None:
        self._thread.start()
        self._starting = False

    def _run(self) -> None:
        self._began.set()
        try:
            self._write()
        except BaseException as error:  # kept for the caller, raised by wait()
            self._error = error
        finally:
            self._write = None  # drops the host copies
            self._ended.set()

    def _wait_ended(self) -> bool:
        """Blocks until the write has finished; False if its thread never started."""
        if self._starting and not self._began.wait(timeout=_START_TIMEOUT):
            return False  # interrupted before the thread began: nothing was written
        self._ended.wait()
        return True

    def done(self) -> bool:
        """Whether the write has finished, successfully or not."""
        return self._ended.is_set()

    def wait(self) -> None:
        """Blocks until the checkpoint is written, renamed into place and durable.

        Raises:
          CheckpointError: The write failed (the previous file at ``path``, if
            any, is unchanged). Raised by every call.
        """
        if not self._wait_ended():
            return
        if self._error is not None:
            self._reported = True
            raise CheckpointError(
                f"The background save of checkpoint {self.path!r} failed: "
                f"{self._error}"
            ) from self._error

    def __repr__(self) -> str:
        state = "done" if self.done() else "writing"
        return f"SaveHandle({self.path!r}, {state})"


class _Writer:
    """The pending background save of this process, if any."""

    def __init__(self) -> None:
        self._pending: SaveHandle | None = None
        self._lock = threading.Lock()
        self._hooked = False

    def submit(self, path: str, write: Callable[[], None]) -> SaveHandle:
        handle = SaveHandle(path, write)
        with self._lock:
            if not self._hooked:
                atexit.register(self.at_exit)
                self._hooked = True
            # Registered before its thread starts: an interrupt at any point after
            # this line leaves a pending handle whose wait() finds out what ran.
            self._pending = handle
        handle._start()
        return handle

    def wait(self) -> None:
        """Waits for the pending save; raises its error unless it was raised already."""
        with self._lock:
            handle, self._pending = self._pending, None
        if handle is not None and not handle._reported:
            handle.wait()

    def settle(self, path: str) -> None:
        """Waits for a pending save to ``path``, leaving its error to be raised later."""
        handle = self._pending
        if handle is not None and _same_path(handle.path, path):
            handle._wait_ended()

    def at_exit(self) -> None:
        self.wait()


def _same_path(a: str, b: str) -> bool:
    normal = lambda p: os.path.normcase(os.path.realpath(p))  # noqa: E731
    return normal(a) == normal(b)


WRITER = _Writer()


def wait() -> None:
    """Waits until the pending background save, if any, is written.

    Call it before reading a checkpoint with another program, or before exiting in
    a way that skips ``atexit`` hooks (``os._exit``). The end of the program waits
    too, and so does every save. :func:`load` of the path being written waits for
    that save alone.

    Raises:
      CheckpointError: The pending background save failed and its error has not
        been raised yet (by its handle's ``wait``, by ``wait`` or by a save).

    Example:
      >>> import numpy as np, cerebrax.ckpt as ckpt
      >>> _ = ckpt.save({"w": np.ones(2)}, "/tmp/wait_doc.h5", background=True)
      >>> ckpt.wait()
      >>> ckpt.is_checkpoint("/tmp/wait_doc.h5")
      True
    """
    WRITER.wait()
