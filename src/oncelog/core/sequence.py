"""Producer sequence arithmetic: int32 sequences that wrap from 2**31-1 to 0.

Kafka's `DefaultRecordBatch.incrementSequence/decrementSequence` and `ProducerAppendInfo.inSequence`,
plus the distance used by range-mode deduplication (KIP-758).
"""
from __future__ import annotations

from oncelog.protocol.records import BatchHeader

MAX_SEQUENCE = 2**31 - 1
SEQUENCE_SPACE = 2**31
NO_SEQUENCE = -1


def increment(seq: int, delta: int) -> int:
    """`seq + delta` in sequence space (delta >= 0)."""
    return (seq + delta) % SEQUENCE_SPACE


def decrement(seq: int, delta: int) -> int:
    """`seq - delta` in sequence space (delta >= 0)."""
    return (seq - delta) % SEQUENCE_SPACE


def last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    """The sequence of a batch's last record."""
    return increment(base_sequence, last_offset_delta)


def last_sequence_of(header: BatchHeader) -> int:
    """The sequence of the last record of a v2 batch."""
    return increment(header.base_sequence, header.last_offset_delta)


def in_sequence(last: int, nxt: int) -> bool:
    """True if `nxt` directly follows `last` (the wraparound rule: MAX then 0)."""
    return nxt == increment(last, 1)


def seq_before(a: int, b: int) -> bool:
    """True if `a` comes before `b`: the shorter way round the wrap decides, so sequences less
    than 2**30 apart compare as their order of assignment."""
    return a != b and (b - a) % SEQUENCE_SPACE < SEQUENCE_SPACE // 2


def distance_below(latest: int, seq: int) -> int:
    """How far `seq` lies at or below `latest`, counting wraparound: 0 when equal.

    Range mode calls a sequence a duplicate when this is below the configured threshold; the
    threshold is at most 2**30 so that "below" and "ahead" never overlap.
    """
    return (latest - seq) % SEQUENCE_SPACE
