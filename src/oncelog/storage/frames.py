"""The frame of oncelog's own append-only logs (the metadata log, a consumer group's records, a
share group's state): the payload's length and CRC-32C, 4 bytes each, then the payload. A crash
can leave the last frame torn; a reader stops at the first frame that is short or fails its CRC,
and the log's owner cuts it there."""
from __future__ import annotations

import struct
from collections.abc import Iterator

from crc32c import crc32c

_HEADER = struct.Struct(">II")


def frame(payload: bytes) -> bytes:
    return _HEADER.pack(len(payload), crc32c(payload)) + payload


def frames(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(start, end, payload) of each whole frame from the start of `data`, up to the first torn
    or corrupt one."""
    pos = 0
    while pos + _HEADER.size <= len(data):
        length, crc = _HEADER.unpack_from(data, pos)
        end = pos + _HEADER.size + length
        payload = data[pos + _HEADER.size:end]
        if len(payload) < length or crc32c(payload) != crc:
            return
        yield pos, end, payload
        pos = end
