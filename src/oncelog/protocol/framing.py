"""Size-prefixed frames: int32 length, then that many bytes.

The length is checked against the limit before anything is buffered for the frame, so an
oversized or negative size costs no allocation (Kafka's `socket.request.max.bytes`).
"""
from __future__ import annotations

import struct

_SIZE = struct.Struct(">i")


class FrameError(Exception):
    """The peer sent a size we refuse; the connection must be closed."""


class FrameDecoder:
    """Received chunks are kept as they came and joined once the frame they complete is whole,
    so a megabyte Produce request is copied once, not once per socket read."""

    __slots__ = ("max_size", "limit_name", "_chunks", "_have", "_need")

    def __init__(self, max_size: int, limit_name: str = "socket.request.max.bytes") -> None:
        self.max_size = max_size
        self.limit_name = limit_name
        self._chunks: list[bytes] = []
        self._have = 0
        self._need = 4

    def feed(self, data: bytes) -> list[memoryview]:
        """Frames completed by `data` (read-only views, valid as long as they are referenced)."""
        self._chunks.append(data)
        self._have += len(data)
        if self._have < self._need:
            return []
        buf = b"".join(self._chunks) if len(self._chunks) > 1 else bytes(data)
        frames = []
        pos, n = 0, len(buf)
        view = memoryview(buf)
        need = 4
        while n - pos >= 4:
            size = _SIZE.unpack_from(buf, pos)[0]
            if size < 0 or size > self.max_size:
                raise FrameError(f"frame size {size} outside 0..{self.max_size} "
                                 f"({self.limit_name})")
            if n - pos - 4 < size:
                need = 4 + size
                break
            frames.append(view[pos + 4:pos + 4 + size])
            pos += 4 + size
        rest = buf[pos:] if pos else buf
        self._chunks = [rest] if rest else []
        self._have = len(rest)
        self._need = need
        return frames

    @property
    def buffered(self) -> int:
        return self._have


def frame(body_parts: list[bytes]) -> bytes:
    """Join parts behind their total size."""
    size = sum(len(p) for p in body_parts)
    return b"".join([_SIZE.pack(size), *body_parts])
