"""The consumer protocol's assignment (`ConsumerProtocolAssignment`, versions 0-3), the bytes a
classic consumer group's leader hands each member in SyncGroup and DescribeGroups shows: a
version, then (topic, partitions) pairs; the user data after them is the assignor's and not read.
Bytes that do not decode read as no partitions: what tools show must not fail on one odd member."""
from __future__ import annotations

import struct

from oncelog.protocol.primitives import Buf, Reader


def decode_assignment(data: Buf | None) -> tuple[tuple[str, int], ...]:
    if not data:
        return ()
    r = Reader(data)
    try:
        r.i16()  # version: the partitions come first in every version
        out: list[tuple[str, int]] = []
        for _ in range(r.array_len(False)):
            topic = r.string(False) or ""
            out += [(topic, r.i32()) for _ in range(r.array_len(False))]
    except (IndexError, struct.error, UnicodeDecodeError, ValueError):
        return ()
    return tuple(out)
