"""Zig-zag varints, as records of a v2 batch use them for lengths, deltas and counts.

Encoding goes through a table: lengths, offset deltas and timestamp deltas are nearly always small
non-negative numbers, and a list lookup costs a fraction of building the bytes (encode.py's fast
paths index `CACHE` directly).
"""
from __future__ import annotations

from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.primitives import Buf, uvarint


def _varint_slow(n: int) -> bytes:
    v = (n << 1) ^ (n >> 63)  # zig-zag
    return _SMALL[v] if v < 0x80 else uvarint(v)


_SMALL = [bytes([i]) for i in range(0x80)]
CACHE_LIMIT = 1 << 14
CACHE = [_varint_slow(i) for i in range(CACHE_LIMIT)]   # CACHE[n] is the varint of n
MINUS_ONE = _varint_slow(-1)                           # a null key, value or header value


def encode_varint(n: int) -> bytes:
    """Zig-zag varint of a signed 64-bit value."""
    if 0 <= n < CACHE_LIMIT:
        return CACHE[n]
    return _varint_slow(n)


def decode_varint(buf: Buf, pos: int) -> tuple[int, int]:
    """Decode a zig-zag varint at `pos`; returns (value, new position)."""
    shift = 0
    result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > 63:
            raise KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, "varint longer than 10 bytes")
    return (result >> 1) ^ -(result & 1), pos
