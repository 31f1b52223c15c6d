"""Size-prefixed frames: int32 length, then that many bytes.

The length is checked against the limit before anything is buffered for the frame, so an
oversized or negative size costs no allocation (Kafka's `socket.request.max.bytes`).
"""
from __future__ import annotations

import struct

_SIZE = struct.Struct(">i")
_FIRST_BIG = 1 << 20  # the buffer a large frame starts with, before its bytes arrive


class FrameError(Exception):
    """The peer sent a size we refuse; the connection must be closed."""


class FrameReader:
    """Frames read straight into their own buffers, for an `asyncio.BufferedProtocol`.

    Small frames are read into one scratch buffer (many per socket read) and copied out; a frame
    larger than the scratch gets a buffer of its own size, which the socket fills directly. Either
    way a frame is one writable buffer the broker may patch in place (offsets of a Produce
    request's batches) and write to its segment, so a megabyte request is copied once, by the
    kernel, instead of three times (joining reads, then a mutable copy for the offsets).
    """

    __slots__ = ("max_size", "limit_name", "_scratch", "_start", "_end", "_big", "_big_have",
                 "_big_size", "_first_big")

    def __init__(self, max_size: int, limit_name: str = "socket.request.max.bytes",
                 scratch_size: int = 64 * 1024, first_big: int = _FIRST_BIG) -> None:
        self.max_size = max_size
        self.limit_name = limit_name
        self._scratch = bytearray(scratch_size)
        self._start = 0  # first byte of the scratch not yet returned in a frame
        self._end = 0  # end of the bytes received into the scratch
        self._big: bytearray | None = None
        self._big_have = 0
        self._big_size = 0
        # what a large frame's buffer starts with before its bytes arrive: small where the peer
        # may be hostile (a broker's clients), the whole frame where it is trusted (a client's broker)
        self._first_big = first_big

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next received bytes go (never empty)."""
        big = self._big
        if big is None:
            return memoryview(self._scratch)[self._end:]
        if self._big_have == len(big):
            # grown as bytes arrive, so that a size alone never reserves socket.request.max.bytes
            big.extend(bytes(min(self._big_size, 2 * len(big)) - len(big)))
        return memoryview(big)[self._big_have:]

    def buffer_updated(self, nbytes: int) -> list[memoryview]:
        """Frames completed by the `nbytes` just written into `get_buffer()`'s buffer."""
        if self._big is not None:
            self._big_have += nbytes
            if self._big_have < self._big_size:
                return []
            done, self._big = self._big, None
            return [memoryview(done)]
        self._end += nbytes
        return self._cut()

    def feed(self, data: bytes) -> list[memoryview]:
        """The same for bytes received some other way."""
        frames: list[memoryview] = []
        view = memoryview(data)
        while view:
            room = self.get_buffer()
            n = min(len(room), len(view))
            room[:n] = view[:n]
            view = view[n:]
            del room  # a buffer being read into cannot grow
            frames += self.buffer_updated(n)
        return frames

    def _cut(self) -> list[memoryview]:
        scratch, pos, end = self._scratch, self._start, self._end
        frames = []
        while end - pos >= 4:
            size = _SIZE.unpack_from(scratch, pos)[0]
            if size < 0 or size > self.max_size:
                raise FrameError(f"frame size {size} outside 0..{self.max_size} ({self.limit_name})")
            if end - pos - 4 >= size:
                frames.append(memoryview(scratch[pos + 4:pos + 4 + size]))
                pos += 4 + size
                continue
            if 4 + size > len(scratch):
                # too big for the scratch: the frame gets its own buffer, the bytes so far move there
                have = end - pos - 4
                big = bytearray(min(size, max(self._first_big, 2 * have)))
                big[:have] = scratch[pos + 4:end]
                self._big, self._big_have, self._big_size = big, have, size
                pos = end
            break
        if pos == end:
            pos = end = 0
        elif end == len(scratch):  # a partial frame at the end: move it to the front
            scratch[:end - pos] = scratch[pos:end]
            pos, end = 0, end - pos
        self._start, self._end = pos, end
        return frames

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned in a frame."""
        return self._end - self._start + (self._big_have if self._big is not None else 0)


def frame(body_parts: list[bytes]) -> bytes:
    """Join parts behind their total size."""
    size = sum(len(p) for p in body_parts)
    return b"".join([_SIZE.pack(size), *body_parts])
