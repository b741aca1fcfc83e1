"""TensorBoard's ``Event`` protocol buffer, encoded and decoded by hand.

Only the fields summaries use are written; every field is skipped safely when read, so
event files from other writers (torch, tensorboardX, TensorFlow) parse too. The field
numbers are those of TensorFlow's ``event.proto``, ``summary.proto``, ``tensor.proto``
and ``tensor_shape.proto``::

    Event          1 wall_time (double)  2 step (int64)  3 file_version (string)
                   5 summary (Summary)
    Summary        1 value (repeated Value)
    Value          1 tag (string)  2 simple_value (float)  8 tensor (TensorProto)
                   9 metadata (SummaryMetadata)
    Metadata       4 data_class (enum; 1 scalar, 2 tensor)
    TensorProto    1 dtype (enum DataType)  2 tensor_shape  4 tensor_content (bytes)
                   5 float_val  6 double_val  7 int_val  8 string_val
                   9 scomplex_val  10 int64_val  11 bool_val  12 dcomplex_val
                   13 half_val  16 uint32_val  17 uint64_val (repeated, packed or not)
    TensorShape    2 dim (repeated Dim: 1 size)

``tensor_content`` holds the array's bytes, little-endian, C order.
"""

from __future__ import annotations

import dataclasses
import struct

import ml_dtypes
import numpy as np

__all__ = ["Event", "ProtoError", "decode_event", "encode_event"]

FILE_VERSION = "brain.Event:2"
_DATA_CLASS_TENSOR = 2

# TensorFlow DataType enum <-> numpy dtype.
_DTYPES: dict[int, np.dtype] = {
    1: np.dtype(np.float32),
    2: np.dtype(np.float64),
    3: np.dtype(np.int32),
    4: np.dtype(np.uint8),
    5: np.dtype(np.int16),
    6: np.dtype(np.int8),
    8: np.dtype(np.complex64),
    9: np.dtype(np.int64),
    10: np.dtype(np.bool_),
    14: np.dtype(ml_dtypes.bfloat16),
    17: np.dtype(np.uint16),
    18: np.dtype(np.complex128),
    19: np.dtype(np.float16),
    22: np.dtype(np.uint32),
    23: np.dtype(np.uint64),
}
_DT_STRING = 7
_ENUMS = {dtype: number for number, dtype in _DTYPES.items()}


class ProtoError(ValueError):
    """Bytes that are not a well-formed protocol buffer message."""


@dataclasses.dataclass
class Event:
    """One decoded event: a file-version record or a list of (tag, value) summaries.

    ``values`` holds ``(tag, value)`` with a Python float for a scalar and a numpy array
    for a tensor; values of other kinds (images, histograms, ...) are left out.
    """

    wall_time: float
    step: int
    file_version: str | None = None
    values: list = dataclasses.field(default_factory=list)


# ---- encoding ---------------------------------------------------------------------------
def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int64 values take ten bytes, as protobuf writes them
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _bytes_field(field: int, payload: bytes) -> bytes:
    return _key(field, 2) + _varint(len(payload)) + payload


def _tensor_proto(array: np.ndarray) -> bytes:
    try:
        dtype = _ENUMS[array.dtype.newbyteorder("=")]
    except KeyError:
        raise ProtoError(f"no TensorBoard dtype for numpy dtype {array.dtype}") from None
    dims = b"".join(_bytes_field(2, _key(1, 0) + _varint(n)) for n in array.shape)
    content = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    return b"".join(
        [
            _key(1, 0) + _varint(dtype),
            _bytes_field(2, dims),
            _bytes_field(4, content),
        ]
    )


def encode_event(
    wall_time: float,
    step: int | None = None,
    *,
    file_version: str | None = None,
    scalar: tuple[str, float] | None = None,
    tensor: tuple[str, np.ndarray] | None = None,
) -> bytes:
    """An ``Event`` with at most one summary value: a scalar or a tensor."""
    parts = [_key(1, 1) + struct.pack("<d", wall_time)]
    if step is not None:
        parts.append(_key(2, 0) + _varint(int(step)))
    if file_version is not None:
        parts.append(_bytes_field(3, file_version.encode()))
    if scalar is not None:
        tag, value = scalar
        body = _bytes_field(1, tag.encode()) + _key(2, 5) + struct.pack("<f", value)
        parts.append(_bytes_field(5, _bytes_field(1, body)))
    if tensor is not None:
        tag, array = tensor
        metadata = _key(4, 0) + _varint(_DATA_CLASS_TENSOR)
        body = b"".join(
            [
                _bytes_field(1, tag.encode()),
                _bytes_field(9, metadata),
                _bytes_field(8, _tensor_proto(array)),
            ]
        )
        parts.append(_bytes_field(5, _bytes_field(1, body)))
    return b"".join(parts)


# ---- decoding ---------------------------------------------------------------------------
def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ProtoError("a varint runs past the end of its message")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, pos


def _fields(data: bytes) -> dict[int, list]:
    """Field number -> values: ints (varint), or bytes (fixed64/fixed32/length-delimited)."""
    out: dict[int, list] = {}
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(data, pos)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, pos = data[pos : pos + size], pos + size
        elif wire == 2:
            size, pos = _read_varint(data, pos)
            value, pos = data[pos : pos + size], pos + size
        else:
            raise ProtoError(f"unsupported wire type {wire} for field {field}")
        if pos > len(data):
            raise ProtoError(f"field {field} runs past the end of its message")
        out.setdefault(field, []).append(value)
    return out


def _signed(n: int) -> int:
    return n - (1 << 64) if n >= 1 << 63 else n


def _varints(values: list) -> list[int]:
    """A repeated varint field, packed (bytes) or not (ints)."""
    out: list[int] = []
    for v in values:
        if isinstance(v, int):
            out.append(v)
            continue
        pos = 0
        while pos < len(v):
            n, pos = _read_varint(v, pos)
            out.append(n)
    return out


def _typed_values(f: dict[int, list], dtype: np.dtype) -> np.ndarray:
    """The values of a TensorProto that uses the repeated ``*_val`` fields."""
    for field, raw in ((5, "<f4"), (6, "<f8"), (9, "<c8"), (12, "<c16")):
        if field in f:
            return np.frombuffer(b"".join(f[field]), raw).astype(dtype)
    if 13 in f:  # half_val: the 16 bits of each float16 or bfloat16, as ints
        return np.array(_varints(f[13]), np.uint16).view(dtype)
    for field in (7, 10, 11, 16, 17):
        if field in f:
            return np.array([_signed(n) for n in _varints(f[field])]).astype(dtype)
    return np.zeros(0, dtype)  # no values: TensorFlow reads zeros


def _tensor(data: bytes) -> np.ndarray | None:
    f = _fields(data)
    number = f.get(1, [0])[-1]
    shape = tuple(
        _signed(_fields(dim).get(1, [0])[-1]) for dim in _fields(f.get(2, [b""])[-1]).get(2, [])
    )
    if number == _DT_STRING:
        return np.array(f.get(8, []), dtype=object).reshape(shape)
    dtype = _DTYPES.get(number)
    if dtype is None:
        return None  # a dtype numpy cannot hold (resources, variants, quantized)
    if 4 in f:
        flat = np.frombuffer(f[4][-1], dtype.newbyteorder("<")).astype(dtype)
    else:
        flat = _typed_values(f, dtype)
    size = int(np.prod(shape))
    if flat.size < size:  # TensorFlow repeats the last value (zeros when none)
        fill = flat[-1] if flat.size else dtype.type(0)
        flat = np.concatenate([flat, np.full(size - flat.size, fill, dtype)])
    if flat.size != size:
        raise ProtoError(f"a tensor of shape {shape} holds {flat.size} values")
    return flat.reshape(shape)


def decode_event(data: bytes) -> Event:
    """The :class:`Event` in ``data`` (raises :class:`ProtoError` if malformed)."""
    f = _fields(data)
    wall_time = struct.unpack("<d", f[1][-1])[0] if 1 in f else 0.0
    event = Event(wall_time, _signed(f.get(2, [0])[-1]))
    if 3 in f:
        event.file_version = f[3][-1].decode(errors="replace")
    for summary in f.get(5, []):
        for value in _fields(summary).get(1, []):
            v = _fields(value)
            tag = v.get(1, [b""])[-1].decode(errors="replace")
            if 2 in v:
                event.values.append((tag, float(struct.unpack("<f", v[2][-1])[0])))
            elif 8 in v:
                array = _tensor(v[8][-1])
                if array is not None:
                    event.values.append((tag, array))
    return event
