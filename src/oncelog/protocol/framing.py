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
    __slots__ = ("max_size", "_buf")

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[memoryview]:
        """Frames completed by `data` (views on a private copy, valid until the next feed)."""
        buf = self._buf
        if buf:
            buf += data
        else:
            buf = bytearray(data)
        frames = []
        pos, n = 0, len(buf)
        view = memoryview(buf)
        while n - pos >= 4:
            size = _SIZE.unpack_from(buf, pos)[0]
            if size < 0 or size > self.max_size:
                raise FrameError(f"frame size {size} outside 0..{self.max_size} "
                                 f"(socket.request.max.bytes)")
            if n - pos - 4 < size:
                break
            frames.append(view[pos + 4:pos + 4 + size])
            pos += 4 + size
        if frames:
            # the frames keep `buf` alive; start a fresh buffer for the remainder
            self._buf = bytearray(buf[pos:])
        else:
            view.release()
            self._buf = buf
        return frames

    @property
    def buffered(self) -> int:
        return len(self._buf)


def frame(body_parts: list[bytes]) -> bytes:
    """Join parts behind their total size."""
    size = sum(len(p) for p in body_parts)
    return b"".join([_SIZE.pack(size), *body_parts])
