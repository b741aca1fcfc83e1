"""``SummaryWriter``: scalars and tensors into a TensorBoard event file, no dependencies."""

from __future__ import annotations

import datetime
import os
import socket
import threading
import time
import weakref
from typing import Any

import numpy as np

from .._filters import is_strict_int
from ..errors import ConfigError
from ._event import FILE_VERSION, ProtoError, encode_event
from ._records import frame

__all__ = ["SummaryWriter"]

_COUNTER = iter(range(1 << 62))  # keeps file names unique within one process


def _as_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def _as_float(tag: str, value: Any) -> float:
    array = _as_numpy(value)
    if array.size != 1:
        raise ConfigError(
            f"A scalar summary needs a single value, but {tag!r} has shape {array.shape}. "
            "Reduce it (e.g. .mean()) or use summarize_tensor / add_tensor."
        )
    return float(array.reshape(()))


def _close_file(file) -> None:
    if not file.closed:
        file.close()


class SummaryWriter:
    """Writes scalar and tensor summaries to a TensorBoard event file in ``log_dir``.

    The file is ``events.out.tfevents.<time>.<host>.<pid>.<n>``: TFRecord framing with
    masked CRC-32C, a ``file_version`` event first, then one event per summary
    (scalars as ``simple_value``, tensors as a ``TensorProto`` with dtype, shape and raw
    little-endian content). ``tensorboard --logdir`` reads it; so does
    :class:`SummaryReader`. Writes are buffered and flushed every ``flush_secs``, on
    :meth:`flush`, on :meth:`close` and when a DataExecutor loop ends.

    Args:
      log_dir: the directory of the event file; created if missing. None uses
        ``runs/<date>_<time>_<host>`` as torch's writer does.
      base_step: the step number of a DataExecutor's first step in
        ``summarize_scalar`` / ``summarize_tensor`` (cstorch's default, 1, logs the
        1-based ``user_iteration``); set it to ``global_step + 1`` when resuming.
      flush_secs: longest time a written summary may stay in the buffer.
      filename_suffix: appended to the event file's name.

    Example:
      >>> with SummaryWriter("runs/demo") as writer:
      ...     writer.add_scalar("loss", 0.25, global_step=1)
      ...     writer.add_tensor("weights", np.eye(2, dtype=np.float32), global_step=1)
    """

    def __init__(
        self,
        log_dir: str | os.PathLike | None = None,
        *,
        base_step: int = 1,
        flush_secs: float = 10.0,
        filename_suffix: str = "",
    ):
        if not is_strict_int(base_step):
            raise ConfigError(f"SummaryWriter(base_step=...) must be an int, got {base_step!r}.")
        if log_dir is None:
            stamp = datetime.datetime.now().strftime("%b%d_%H-%M-%S")
            log_dir = os.path.join("runs", f"{stamp}_{socket.gethostname()}")
        self.log_dir = os.fspath(log_dir)
        self.base_step = base_step
        self.flush_secs = flush_secs
        os.makedirs(self.log_dir, exist_ok=True)
        name = (
            f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}."
            f"{os.getpid()}.{next(_COUNTER)}{filename_suffix}"
        )
        self.file_path = os.path.join(self.log_dir, name)
        self._file = open(self.file_path, "wb")  # noqa: SIM115  (closed by close())
        self._finalizer = weakref.finalize(self, _close_file, self._file)
        self._lock = threading.Lock()
        self._last_flush = time.monotonic()
        self._write(encode_event(time.time(), file_version=FILE_VERSION), flush=True)

    # ---- writing ------------------------------------------------------------------------
    def _write(self, event: bytes, *, flush: bool = False) -> None:
        with self._lock:
            if self._file.closed:
                raise ConfigError(
                    f"The SummaryWriter of {self.log_dir!r} is closed; create a new one."
                )
            self._file.write(frame(event))
            if flush or time.monotonic() - self._last_flush >= self.flush_secs:
                self._flush_locked()

    def _flush_locked(self) -> None:
        self._file.flush()
        self._last_flush = time.monotonic()

    @staticmethod
    def _check_tag(tag: Any) -> str:
        if not isinstance(tag, str) or not tag:
            raise ConfigError(f"A summary tag must be a non-empty string, got {tag!r}.")
        return tag

    def add_scalar(
        self,
        tag: str,
        scalar_value: Any,
        global_step: int | None = None,
        walltime: float | None = None,
    ) -> None:
        """Writes ``scalar_value`` (a number or a one-element array) under ``tag``.

        TensorBoard stores scalars as float32.
        """
        value = _as_float(self._check_tag(tag), scalar_value)
        wall = time.time() if walltime is None else walltime
        self._write(encode_event(wall, global_step, scalar=(tag, value)))

    def add_tensor(
        self,
        tag: str,
        tensor: Any,
        global_step: int | None = None,
        walltime: float | None = None,
    ) -> None:
        """Writes the array ``tensor`` (numpy, JAX or torch) under ``tag``, exactly.

        Every numeric numpy dtype is kept, bfloat16 included; strings and objects are not.
        """
        array = _as_numpy(tensor)
        wall = time.time() if walltime is None else walltime
        try:
            event = encode_event(wall, global_step, tensor=(self._check_tag(tag), array))
        except ProtoError as e:
            raise ConfigError(f"Cannot write tensor summary {tag!r}: {e}.") from None
        self._write(event)

    # ---- lifetime -----------------------------------------------------------------------
    def flush(self) -> None:
        """Writes the buffered summaries to the file (no fsync)."""
        with self._lock:
            if not self._file.closed:
                self._flush_locked()

    def close(self) -> None:
        """Flushes and closes the file; later writes raise. Closing twice is fine."""
        with self._lock:
            self._finalizer()

    def __enter__(self) -> SummaryWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SummaryWriter({self.log_dir!r}, base_step={self.base_step})"
