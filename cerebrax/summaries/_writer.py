"""``SummaryWriter``: scalars and tensors into a TensorBoard event file, through tensorboardX.

The writer builds tensorboardX's ``Event`` / ``Summary`` / ``TensorProto`` messages and
hands their serialized bytes to tensorboardX's ``RecordWriter``, which frames the
records and checksums them. It writes synchronously, on the calling thread, so
:meth:`SummaryWriter.flush` returning means every summary written before it is in the
file (tensorboardX's own ``SummaryWriter`` queues events for a background thread, and
its ``flush`` does not wait for the queue).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import types
import os
import socket
import threading
import time
import weakref
from typing import Any

import ml_dtypes
import numpy as np

from .._filters import is_strict_int, is_torch_tensor
from ..errors import ConfigError, SummaryError

__all__ = ["SummaryWriter"]

FILE_VERSION = "brain.Event:2"  # the first event of every TensorBoard event file
_COUNTER = iter(range(1 << 62))  # keeps file names unique within one process

@functools.cache
def _tbx() -> types.SimpleNamespace:
    """tensorboardX's record writer and messages, imported when the first writer opens.

    ``import tensorboardX`` imports torch when torch is installed, so it waits until a
    summary is written: ``import cerebrax`` and checkpoint code stay torch-free.
    """
    from tensorboardX import RecordWriter
    from tensorboardX.proto import types_pb2
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboardX.proto.tensor_pb2 import TensorProto
    from tensorboardX.proto.tensor_shape_pb2 import TensorShapeProto

    # numpy dtype -> TensorFlow's DataType number, the ``dtype`` of a TensorProto. The
    # copy of types.proto inside tensorboardX stops before DT_UINT32 (22) and DT_UINT64
    # (23); the field is an open proto3 enum and TensorBoard's reader knows both numbers.
    data_types = {
        np.dtype(np.float32): types_pb2.DT_FLOAT,
        np.dtype(np.float64): types_pb2.DT_DOUBLE,
        np.dtype(np.float16): types_pb2.DT_HALF,
        np.dtype(ml_dtypes.bfloat16): types_pb2.DT_BFLOAT16,
        np.dtype(np.int8): types_pb2.DT_INT8,
        np.dtype(np.int16): types_pb2.DT_INT16,
        np.dtype(np.int32): types_pb2.DT_INT32,
        np.dtype(np.int64): types_pb2.DT_INT64,
        np.dtype(np.uint8): types_pb2.DT_UINT8,
        np.dtype(np.uint16): types_pb2.DT_UINT16,
        np.dtype(np.uint32): 22,
        np.dtype(np.uint64): 23,
        np.dtype(np.bool_): types_pb2.DT_BOOL,
        np.dtype(np.complex64): types_pb2.DT_COMPLEX64,
        np.dtype(np.complex128): types_pb2.DT_COMPLEX128,
    }
    return types.SimpleNamespace(RecordWriter=RecordWriter, Event=Event, Summary=Summary,
                                 SummaryMetadata=SummaryMetadata, TensorProto=TensorProto, TensorShapeProto=TensorShapeProto,
                                 data_types=data_types, string_type=types_pb2.DT_STRING)


def _as_numpy(value: Any) -> np.ndarray:
    if is_torch_tensor(value):
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


def _tensor_proto(tag: str, array: np.ndarray) -> Any:
    """``array`` as a TensorProto: dtype, shape and little-endian C-order bytes."""
    tbx = _tbx()
    native = array.dtype.newbyteorder("=")
    if native not in tbx.data_types:
        names = ", ".join(sorted(str(d) for d in tbx.data_types))
        raise ConfigError(
            f"Cannot write tensor summary {tag!r}: {array.dtype=} has no TensorBoard "
            f"type. Cast it to one of: {names}."
        )
    shape = tbx.TensorShapeProto(dim=[tbx.TensorShapeProto.Dim(size=n) for n in array.shape])
    content = array.astype(native.newbyteorder("<"), copy=False).tobytes()
    return tbx.TensorProto(dtype=tbx.data_types[native], tensor_shape=shape,
                           tensor_content=content)


def _close_quietly(records: Any) -> None:
    """Closes an event file that its writer left open (garbage collection, exit)."""
    with contextlib.suppress(OSError):
        records.close()


class SummaryWriter:
    """Writes scalar and tensor summaries to a TensorBoard event file in ``log_dir``.

    The file is ``events.out.tfevents.<time>.<host>.<pid>.<n>``, written with
    tensorboardX: a ``file_version`` event first, then one event per summary (scalars
    as ``simple_value``, tensors as a ``TensorProto`` with dtype, shape and raw
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
      >>> from cerebrax.utils.tensorboard import SummaryReader, SummaryWriter
      >>> with SummaryWriter("runs/demo") as writer:
      ...     writer.add_scalar("loss", 0.25, global_step=1)
      ...     writer.add_tensor("weights", np.eye(2, dtype=np.float32), global_step=1)
      >>> SummaryReader("runs/demo").tags()
      {'scalars': ['loss'], 'tensors': ['weights']}
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
        self._records = _tbx().RecordWriter(self.file_path)
        self._finalizer = weakref.finalize(self, _close_quietly, self._records)
        self._lock = threading.Lock()
        self._last_flush = time.monotonic()
        try:
            self._write(_tbx().Event(wall_time=time.time(), file_version=FILE_VERSION),
                        flush=True)
        except SummaryError:
            self._finalizer()  # a file that cannot be written is closed and removed
            with contextlib.suppress(OSError):
                os.remove(self.file_path)
            raise

    # ---- writing ------------------------------------------------------------------------
    def _write(self, event: Any, *, flush: bool = False) -> None:
        with self._lock:
            if not self._finalizer.alive:
                raise ConfigError(
                    f"The SummaryWriter of {self.log_dir!r} is closed; create a new one."
                )
            try:
                self._records.write(event.SerializeToString())
            except OSError as e:
                raise self._write_error(e) from e
            if flush or time.monotonic() - self._last_flush >= self.flush_secs:
                self._flush_locked()

    def _flush_locked(self) -> None:
        try:
            self._records.flush()
        except OSError as e:
            raise self._write_error(e) from e
        self._last_flush = time.monotonic()

    def _write_error(self, error: OSError) -> SummaryError:
        return SummaryError(
            f"Could not write the TensorBoard event file {self.file_path!r}: "
            f"{error.strerror or error}."
        )

    @staticmethod
    def _check_tag(tag: Any) -> str:
        if not isinstance(tag, str) or not tag:
            raise ConfigError(f"A summary tag must be a non-empty string, got {tag!r}.")
        return tag

    @staticmethod
    def _event(value: Any, step: int | None, walltime: float | None) -> Any:
        wall = time.time() if walltime is None else walltime
        event = _tbx().Event(wall_time=wall, summary=_tbx().Summary(value=[value]))
        if step is not None:
            event.step = int(step)
        return event

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
        value = _tbx().Summary.Value(tag=tag, simple_value=value)
        self._write(self._event(value, global_step, walltime))

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
        proto = _tensor_proto(self._check_tag(tag), _as_numpy(tensor))
        value = _tbx().Summary.Value(tag=tag, tensor=proto)
        self._write(self._event(value, global_step, walltime))

    def add_text(
        self,
        tag: str,
        text_string: str,
        global_step: int | None = None,
        walltime: float | None = None,
    ) -> None:
        """Writes ``text_string`` under ``tag`` as TensorBoard's text plugin shows it (a
        string tensor, as torch's ``SummaryWriter.add_text`` writes it)."""
        if not isinstance(text_string, str):
            raise ConfigError(f"add_text({tag!r}, ...) takes a str, got "
                              f"{type(text_string).__name__}.")
        tbx = _tbx()
        proto = tbx.TensorProto(dtype=tbx.string_type,
                                string_val=[text_string.encode("utf-8")],
                                tensor_shape=tbx.TensorShapeProto(
                                    dim=[tbx.TensorShapeProto.Dim(size=1)]))
        metadata = tbx.SummaryMetadata(
            plugin_data=tbx.SummaryMetadata.PluginData(plugin_name="text"))
        value = tbx.Summary.Value(tag=self._check_tag(tag), metadata=metadata, tensor=proto)
        self._write(self._event(value, global_step, walltime))

    # ---- what torch's and cstorch's writers expose --------------------------------------
    def _get_file_writer(self) -> types.SimpleNamespace:
        """torch's ``SummaryWriter._get_file_writer()``, as far as code reads it: its
        ``event_writer._file_name`` is this writer's event file (Model Zoo links to it)."""
        return types.SimpleNamespace(
            event_writer=types.SimpleNamespace(_file_name=self.file_path),
            get_logdir=lambda: self.log_dir, flush=self.flush)

    @property
    def cs_events_dir(self) -> str:
        """cstorch's folder for the Cerebras events of this writer: ``<log_dir>/cs_events``,
        created on first use. cerebrax writes nothing there (it has no wafer events);
        code that links to or lists it (Model Zoo's TensorBoard logger) finds it."""
        path = os.path.join(self.log_dir, "cs_events")
        os.makedirs(path, exist_ok=True)
        return path

    # ---- lifetime -----------------------------------------------------------------------
    def flush(self) -> None:
        """Writes the buffered summaries to the file and syncs it to disk."""
        with self._lock:
            if self._finalizer.alive:
                self._flush_locked()

    def close(self) -> None:
        """Flushes and closes the file; later writes raise. Closing twice is fine.

        Raises:
          SummaryError: the buffered summaries could not be written (the file is
            closed all the same).
        """
        with self._lock:
            if not self._finalizer.alive:
                return
            self._finalizer.detach()
            try:
                self._records.close()
            except OSError as e:
                raise self._write_error(e) from e

    def __enter__(self) -> SummaryWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SummaryWriter({self.log_dir!r}, base_step={self.base_step})"
