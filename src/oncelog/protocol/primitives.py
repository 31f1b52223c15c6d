"""Kafka's wire primitives: a sequential reader and the writers for the hand-written codecs.

kio covers most entities; the hot paths (Produce, Fetch) and the responses that carry our tagged
fields (ProduceResponse v14, MetadataResponse) are written by hand on top of these.
"""
from __future__ import annotations

import struct
import uuid

I8 = struct.Struct(">b")
I16 = struct.Struct(">h")
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")
NULL_UUID = uuid.UUID(int=0)

# What the codecs read: a frame (bytearray), a view into one, or bytes.
Buf = bytes | bytearray | memoryview


class Reader:
    """Sequential reader of Kafka primitives over one message body."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: Buf, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos

    def i8(self) -> int:
        v = self.buf[self.pos]
        self.pos += 1
        return v - 256 if v > 127 else v

    def i16(self) -> int:
        v: int = I16.unpack_from(self.buf, self.pos)[0]
        self.pos += 2
        return v

    def i32(self) -> int:
        v: int = I32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return v

    def i64(self) -> int:
        v: int = I64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return v

    def uvarint(self) -> int:
        shift = result = 0
        while True:
            b = self.buf[self.pos]
            self.pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result
            shift += 7
            if shift > 35:
                raise ValueError("varint longer than 5 bytes")

    def uuid(self) -> uuid.UUID:
        v = uuid.UUID(bytes=bytes(self.buf[self.pos:self.pos + 16]))
        self.pos += 16
        return v

    def boolean(self) -> bool:
        return self.i8() != 0

    def _take(self, n: int) -> Buf:
        if n > len(self.buf) - self.pos:
            raise ValueError(f"field of {n} bytes runs past the end of the message")
        v = self.buf[self.pos:self.pos + n]
        self.pos += n
        return v

    def string(self, compact: bool) -> str | None:
        n = self.uvarint() - 1 if compact else self.i16()
        if n < 0:
            return None
        return bytes(self._take(n)).decode()

    def bytes_(self, compact: bool) -> bytes | None:
        n = self.uvarint() - 1 if compact else self.i32()
        if n < 0:
            return None
        return bytes(self._take(n))

    def bytes_view(self, compact: bool) -> memoryview | None:
        """Like bytes_ without copying: record sets are passed on as views."""
        n = self.uvarint() - 1 if compact else self.i32()
        if n < 0:
            return None
        return memoryview(self._take(n))

    def array_len(self, compact: bool) -> int:
        n = self.uvarint() - 1 if compact else self.i32()
        if n > len(self.buf) - self.pos:
            raise ValueError(f"array of {n} elements cannot fit in the message")
        return n

    def tags(self) -> dict[int, memoryview]:
        out = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            out[tag] = memoryview(self._take(self.uvarint()))
        return out

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.pos += self.uvarint()


def uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def string(s: str | None, compact: bool) -> bytes:
    if s is None:
        return b"\x00" if compact else b"\xff\xff"
    b = s.encode()
    return (uvarint(len(b) + 1) if compact else I16.pack(len(b))) + b


def array_len(n: int | None, compact: bool) -> bytes:
    if n is None:
        return b"\x00" if compact else b"\xff\xff\xff\xff"
    return uvarint(n + 1) if compact else I32.pack(n)


def bytes_len(n: int | None, compact: bool) -> bytes:
    if n is None:
        return b"\x00" if compact else b"\xff\xff\xff\xff"
    return uvarint(n + 1) if compact else I32.pack(n)


def tagged_fields(fields: dict[int, bytes] | None) -> bytes:
    """A tagged-field section; tags must be written in increasing order."""
    if not fields:
        return b"\x00"
    out = [uvarint(len(fields))]
    for tag in sorted(fields):
        value = fields[tag]
        out.append(uvarint(tag) + uvarint(len(value)) + value)
    return b"".join(out)
