"""TFRecord framing, the container of TensorBoard event files.

Each record is ``length`` (uint64, little-endian), the masked CRC-32C of those 8 bytes
(uint32), ``length`` bytes of payload, and the masked CRC-32C of the payload. CRC-32C
is the Castagnoli polynomial (reflected ``0x82F63B78``); the mask rotates the CRC right
by 15 bits and adds ``0xA282EAD8``, so that a CRC of data that itself holds CRCs is not
degenerate.

Python's ``zlib.crc32`` is the IEEE polynomial, so CRC-32C is computed here: a plain
table loop for short payloads (every scalar event), and for long ones (tensor summaries)
many lanes of the payload processed in lockstep with numpy, then folded together using
the linearity of the CRC. That keeps a 10 MB tensor summary at tens of milliseconds
instead of seconds on the host, between two steps.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import numpy as np

__all__ = ["crc32c", "frame", "masked_crc32c", "unframe"]

_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected


def _byte_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _byte_table()
_NP_TABLE = np.array(_TABLE, dtype=np.uint32)
_SHORT = 8192  # payloads below this many bytes use the plain loop


def _update(crc: int, data: bytes | memoryview) -> int:
    """The CRC register after ``data`` (no initial or final inversion)."""
    table = _TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc


def _update_wide(crc: int, data: memoryview) -> int:
    """``_update`` for long inputs: ``lanes`` chunks in lockstep, then folded.

    The register update is linear over GF(2): running chunk ``D`` of ``L`` bytes from
    register ``s`` gives ``R(0, D) ^ Z(s)``, where ``Z`` runs ``L`` zero bytes. The lanes
    compute every ``R(0, D_i)`` at once; 32 extra lanes run zeros from each basis state
    ``1 << b`` to give ``Z``, which is then applied by four byte tables.
    """
    n = len(data)
    lanes = int(min(max(np.sqrt(8 * n), 64), 1 << 14))
    length = n // lanes
    head = n - lanes * length
    crc = _update(crc, data[:head])
    chunks = np.frombuffer(data[head:], dtype=np.uint8).reshape(lanes, length)
    block = np.zeros((length, lanes + 32), dtype=np.uint8)
    block[:, :lanes] = chunks.T
    reg = np.zeros(lanes + 32, dtype=np.uint32)
    reg[lanes:] = np.uint32(1) << np.arange(32, dtype=np.uint32)
    for row in block:
        reg = _NP_TABLE[(reg ^ row) & 0xFF] ^ (reg >> 8)
    basis = reg[lanes:]
    byte_bits = (np.arange(256)[:, None] >> np.arange(8)) & 1
    shift = [
        np.bitwise_xor.reduce(np.where(byte_bits, basis[8 * k : 8 * k + 8], 0), axis=1).tolist()
        for k in range(4)
    ]
    t0, t1, t2, t3 = shift
    for c in reg[:lanes].tolist():
        crc = t0[crc & 0xFF] ^ t1[(crc >> 8) & 0xFF] ^ t2[(crc >> 16) & 0xFF] ^ t3[crc >> 24] ^ c
    return crc


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """The CRC-32C (Castagnoli) checksum of ``data``.

    Example:
      >>> hex(crc32c(b"123456789"))
      '0xe3069283'
    """
    view = memoryview(data).cast("B")
    update = _update if len(view) < _SHORT else _update_wide
    return update(0xFFFFFFFF, view) ^ 0xFFFFFFFF


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """The CRC-32C of ``data`` masked as TFRecord stores it."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(payload: bytes) -> bytes:
    """One TFRecord holding ``payload``."""
    header = struct.pack("<Q", len(payload))
    return b"".join(
        [
            header,
            struct.pack("<I", masked_crc32c(header)),
            payload,
            struct.pack("<I", masked_crc32c(payload)),
        ]
    )


class FramingError(ValueError):
    """A record is truncated or fails its checksum (``offset`` is where it starts)."""

    def __init__(self, offset: int, problem: str):
        super().__init__(problem)
        self.offset = offset
        self.problem = problem


def unframe(data: bytes) -> Iterator[bytes]:
    """The payloads of the TFRecords in ``data``, each checked against its CRCs."""
    view = memoryview(data)
    offset = 0
    while offset < len(view):
        if len(view) - offset < 12:
            raise FramingError(offset, "the file ends inside a record header")
        header = view[offset : offset + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", view[offset + 8 : offset + 12])
        if masked_crc32c(header) != header_crc:
            raise FramingError(offset, "the length field fails its CRC")
        end = offset + 12 + length + 4
        if end > len(view):
            raise FramingError(offset, f"the file ends inside a {length}-byte record")
        payload = view[offset + 12 : end - 4]
        (payload_crc,) = struct.unpack("<I", view[end - 4 : end])
        if masked_crc32c(payload) != payload_crc:
            raise FramingError(offset, "the payload fails its CRC")
        yield payload.tobytes()
        offset = end
