"""OffsetCommitResponse (v2-v9) and TxnOffsetCommitResponse (v0-v5) written by hand: one error code
per partition of the request, which may name thousands (issue 36: 2,000 partitions took 30-60 ms to
build and encode through kio, on the event loop, at every commit). Both have the same shape:
[ThrottleTimeMs] Topics [Name, Partitions [PartitionIndex, ErrorCode]], flexible (compact arrays
and strings, a tagged-field byte after each struct) from OffsetCommit v8 and TxnOffsetCommit v3;
OffsetCommit v2 has no ThrottleTimeMs. Byte for byte what kio writes
(tests/protocol/test_offset_commit_answers.py)."""
from __future__ import annotations

import struct
from collections.abc import Sequence

from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.primitives import I32, array_len, string

_NO_TAGS = b"\x00"
OFFSET_COMMIT_FIRST_FLEXIBLE = 8
OFFSET_COMMIT_FIRST_THROTTLE = 3
TXN_OFFSET_COMMIT_FIRST_FLEXIBLE = 3

Topics = Sequence[tuple[str, Sequence[tuple[int, int]]]]   # (name, [(partition index, error code)])


def partition_code(tp: tuple[str, int], error: int, denied: set[tuple[str, int]], unknown: set[tuple[str, int]],
                   too_large: set[tuple[str, int]]) -> int:
    """A partition's code: its own refusal (not readable, unknown, metadata too large), else the
    request's."""
    if not (denied or unknown or too_large):
        return error
    return (ErrorCode.TOPIC_AUTHORIZATION_FAILED if tp in denied else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            if tp in unknown else ErrorCode.OFFSET_METADATA_TOO_LARGE if tp in too_large else error)


def offset_commit(version: int, topics: Topics, throttle_ms: int = 0) -> bytes:
    return _encode(topics, version >= OFFSET_COMMIT_FIRST_FLEXIBLE,
                   throttle_ms if version >= OFFSET_COMMIT_FIRST_THROTTLE else None)


def txn_offset_commit(version: int, topics: Topics, throttle_ms: int = 0) -> bytes:
    return _encode(topics, version >= TXN_OFFSET_COMMIT_FIRST_FLEXIBLE, throttle_ms)


def _encode(topics: Topics, flexible: bool, throttle_ms: int | None) -> bytes:
    out = [] if throttle_ms is None else [I32.pack(throttle_ms)]
    out.append(array_len(len(topics), flexible))
    entry = "ihB" if flexible else "ih"
    for name, partitions in topics:
        out += (string(name, flexible), array_len(len(partitions), flexible))
        if flexible:
            out.append(struct.pack(">" + entry * len(partitions), *(x for i, c in partitions for x in (i, c, 0))))
            out.append(_NO_TAGS)
        else:
            out.append(struct.pack(">" + entry * len(partitions), *(x for i, c in partitions for x in (i, c))))
    if flexible:
        out.append(_NO_TAGS)
    return b"".join(out)
