"""One event file's scalars and tensors, read by TensorBoard's own event reader.

TensorBoard's ``RawEventFileLoader`` yields the file's records after checking each
one's checksums, and stops quietly at the first record it cannot read (a file that is
still being written ends that way). This module counts the bytes of the records it got
and compares them with the file's size, so a damaged or cut-short file raises
:class:`SummaryError` instead of losing its tail unnoticed.

Each event goes through TensorBoard's ``data_compat`` first, as in TensorBoard itself,
so every summary is a tensor: scalars carry the ``scalars`` plugin's metadata, the
tensors of ``SummaryWriter.add_tensor`` carry none, and other kinds (images,
histograms, text) carry their plugin's and are left out.

Importing this module imports ``tensorboard``; :mod:`._reader` imports it only when a
``SummaryReader`` is made, so cerebrax works without the ``tensorboard`` extra.
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

import ml_dtypes
import numpy as np
from google.protobuf.message import DecodeError
from tensorboard import data_compat
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto import types_pb2
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.tensorflow_stub import dtypes
from tensorboard.plugins.scalar.metadata import PLUGIN_NAME as SCALARS_PLUGIN
from tensorboard.util import tensor_util

from ..errors import SummaryError

__all__ = ["FileSummaries", "read_event_file"]

# A record is its length (8 bytes, little-endian), the length's checksum (4), the data,
# and the data's checksum (4). Only used to say where a file stops being readable.
_HEADER_BYTES = 12
_FRAMING_BYTES = 16

MSG_CORRUPT = """\
The event file {path} is damaged at byte {offset}: {problem}.
Summaries before that byte are intact. If the run is still writing this file, read it
again after writer.flush() or writer.close(); if the run crashed mid-write, the file is
truncated. Copy the intact prefix to a new file to keep what was written, e.g.
    head -c {offset} {path} > {path}.intact"""


class FileSummaries(NamedTuple):
    """What one event file holds: ``(tag, wall_time, step, value)`` per summary."""

    file_version: str | None
    scalars: list[tuple[str, float, int, float]]
    tensors: list[tuple[str, float, int, np.ndarray]]


def _array(tensor: TensorProto) -> np.ndarray | None:
    """The numpy array of ``tensor``, or None for a dtype numpy cannot hold."""
    shape = [d.size for d in tensor.tensor_shape.dim]
    if tensor.dtype == types_pb2.DT_BFLOAT16:
        # TensorBoard without TensorFlow has no numpy bfloat16: read the bits as float16.
        half = TensorProto()
        half.CopyFrom(tensor)
        half.dtype = types_pb2.DT_HALF
        return tensor_util.make_ndarray(half).view(ml_dtypes.bfloat16)
    try:
        if 0 in shape and not tensor.tensor_content:  # no values to decode
            return np.zeros(shape, dtypes.as_dtype(tensor.dtype).as_numpy_dtype)
        return tensor_util.make_ndarray(tensor)
    except TypeError:  # e.g. DT_RESOURCE or DT_VARIANT
        return None


def _damage(path: str, offset: int, size: int) -> str:
    """Why the record at ``offset`` could not be read (TensorBoard's loader stops silently)."""
    with open(path, "rb") as f:
        f.seek(offset)
        head = f.read(_HEADER_BYTES)
    if len(head) < _HEADER_BYTES:
        return f"the file ends inside the header of the record there ({size - offset} bytes)"
    (length,) = struct.unpack("<Q", head[:8])
    if offset + _FRAMING_BYTES + length > size:
        return (
            f"the record there claims {length} bytes, but the file ends inside it "
            f"({size - offset - _FRAMING_BYTES} bytes left): it was cut short, or its "
            "length is damaged"
        )
    return "the record there fails TensorBoard's checksum check"


def read_event_file(path: str) -> FileSummaries:
    """The scalars and tensors of the event file ``path``, in the order written."""
    file_version, scalars, tensors = None, [], []
    offset = 0
    for index, record in enumerate(RawEventFileLoader(path).Load()):
        try:
            event = data_compat.migrate_event(Event.FromString(record))
        except DecodeError as e:
            problem = f"the record there is not a TensorBoard Event ({e})"
            raise SummaryError(MSG_CORRUPT.format(path=path, offset=offset, problem=problem))
        offset += len(record) + _FRAMING_BYTES
        if index == 0 and event.file_version:
            file_version = event.file_version
        for value in event.summary.value:
            plugin = value.metadata.plugin_data.plugin_name
            array = _array(value.tensor) if value.HasField("tensor") else None
            if array is None or plugin not in ("", SCALARS_PLUGIN):
                continue
            if plugin == SCALARS_PLUGIN:
                scalars.append((value.tag, event.wall_time, event.step, float(array.reshape(()))))
            else:
                tensors.append((value.tag, event.wall_time, event.step, array))
    size = os.path.getsize(path)
    if offset < size:
        problem = _damage(path, offset, size)
        raise SummaryError(MSG_CORRUPT.format(path=path, offset=offset, problem=problem))
    return FileSummaries(file_version, scalars, tensors)
