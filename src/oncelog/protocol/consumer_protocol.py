"""The consumer protocol's embedded messages of classic groups: the assignment
(`ConsumerProtocolAssignment`, versions 0-3), the bytes a classic consumer group's leader hands
each member in SyncGroup and DescribeGroups shows: a version, then (topic, partitions) pairs; the
user data after them is the assignor's and not read. And the subscription
(`ConsumerProtocolSubscription`) a member joins with: a version, then its topics. Bytes that do not
decode read as nothing: what tools show must not fail on one odd member."""
from __future__ import annotations

import struct

from oncelog.protocol.primitives import I16, I32, Buf, Reader, string


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


def encode_assignment(partitions: dict[str, list[int]]) -> bytes:
    """ConsumerProtocolAssignment v0: what a classic group's leader hands a member."""
    out = [I16.pack(0), I32.pack(len(partitions))]
    for topic, ps in sorted(partitions.items()):
        out += [string(topic, False), I32.pack(len(ps)), *(I32.pack(p) for p in sorted(ps))]
    out.append(I32.pack(-1))  # no user data
    return b"".join(out)


def encode_subscription(topics: list[str]) -> bytes:
    """ConsumerProtocolSubscription v0: a classic member's metadata for its assignor."""
    return b"".join([I16.pack(0), I32.pack(len(topics)), *(string(t, False) for t in sorted(topics)),
                     I32.pack(-1)])


def decode_subscription(data: Buf | None) -> tuple[str, ...]:
    """The topics of a ConsumerProtocolSubscription (any version: they come first); none when the
    bytes do not decode."""
    if not data:
        return ()
    r = Reader(data)
    try:
        r.i16()
        return tuple(r.string(False) or "" for _ in range(r.array_len(False)))
    except (IndexError, struct.error, UnicodeDecodeError, ValueError):
        return ()
