"""A minimal TensorBoard event-file writer: scalars and histograms, the records TensorBoard's
``EventAccumulator`` reads (TFRecord framing with masked CRC-32C, ``Event`` / ``Summary``
protocol buffers encoded by hand). No dependency."""

from __future__ import annotations

import os
import socket
import struct
import time
from typing import BinaryIO, List, Optional, Sequence

_CRC_TABLE: List[int] = []


def _crc_table() -> List[int]:
    if not _CRC_TABLE:
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            _CRC_TABLE.append(c)
    return _CRC_TABLE


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of `data`."""
    t = _crc_table()
    c = 0xFFFFFFFF
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _masked(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _bytes(field: int, data: bytes) -> bytes:
    return _key(field, 2) + _varint(len(data)) + data


def _double(field: int, x: float) -> bytes:
    return _key(field, 1) + struct.pack("<d", x)


def _packed_doubles(field: int, xs: Sequence[float]) -> bytes:
    return _bytes(field, struct.pack(f"<{len(xs)}d", *xs))


def _event(step: int, summary: Optional[bytes] = None, file_version: Optional[str] = None) -> bytes:
    e = _double(1, time.time()) + _key(2, 0) + _varint(int(step))
    if file_version is not None:
        e += _bytes(3, file_version.encode())
    if summary is not None:
        e += _bytes(5, summary)
    return e


def scalar_value(tag: str, x: float) -> bytes:
    """A ``Summary.Value`` holding a scalar."""
    return _bytes(1, _bytes(1, tag.encode()) + _key(2, 5) + struct.pack("<f", float(x)))


def histogram_value(tag: str, counts: Sequence[float], edges: Sequence[float], stats: Sequence[float]) -> bytes:
    """A ``Summary.Value`` holding a histogram: `counts[i]` values in `(edges[i], edges[i+1]]`;
    `stats` = (min, max, count, sum, sum of squares)."""
    lo, hi, n, s, s2 = stats
    h = _double(1, lo) + _double(2, hi) + _double(3, n) + _double(4, s) + _double(5, s2)
    h += _packed_doubles(6, list(edges[1:])) + _packed_doubles(7, [float(c) for c in counts])
    return _bytes(1, _bytes(1, tag.encode()) + _bytes(5, h))


class EventWriter:
    """Appends events to ``events.out.tfevents.<time>.<host>`` in `log_dir` (flushed per
    step, so a crash loses at most the step being written)."""

    def __init__(self, log_dir: str) -> None:
        os.makedirs(log_dir, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.trmask"
        self.path = os.path.join(log_dir, name)
        self._f: Optional[BinaryIO] = open(self.path, "ab")
        self._write(_event(0, file_version="brain.Event:2"))

    def _write(self, data: bytes) -> None:
        assert self._f is not None
        head = struct.pack("<Q", len(data))
        self._f.write(head + struct.pack("<I", _masked(head)) + data + struct.pack("<I", _masked(data)))

    def add(self, step: int, values: Sequence[bytes]) -> None:
        """One event at `step` holding `values` (:func:`scalar_value`, :func:`histogram_value`)."""
        if self._f is None:
            raise ValueError("invalid input `step`: the TensorBoard writer is closed")
        self._write(_event(step, summary=b"".join(values)))
        self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
