"""Kafka's default partitioner: murmur2 of the key bytes, sign bit cleared, modulo partitions.

Same arithmetic as `org.apache.kafka.common.utils.Utils.murmur2` / `toPositive`, so a keyed record
lands on the same partition as with the Java client (and librdkafka's `murmur2_random`).
Keyless records use sticky partitioning (KIP-480): one partition per topic until its batch closes.
"""
from __future__ import annotations

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 as a signed int (what `Utils.murmur2` returns)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    n4 = length // 4
    mv = memoryview(data)
    words = mv[: n4 * 4].cast("I") if n4 else ()  # little-endian hosts only
    for k in words:
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length & 3
    base = n4 * 4
    if tail == 3:
        h ^= data[base + 2] << 16
    if tail >= 2:
        h ^= data[base + 1] << 8
    if tail >= 1:
        h ^= data[base]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, num_partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


class StickyPartitioner:
    """Keyless records stick to one partition per topic until `on_new_batch` moves them on."""

    def __init__(self) -> None:
        self._sticky: dict[str, int] = {}
        self._counter = 0

    def partition(self, topic: str, key: bytes | None, num_partitions: int) -> int:
        if key is not None:
            return partition_for_key(key, num_partitions)
        p = self._sticky.get(topic)
        if p is None or p >= num_partitions:
            p = self._counter % num_partitions
            self._counter += 1
            self._sticky[topic] = p
        return p

    def on_new_batch(self, topic: str, num_partitions: int, previous: int) -> None:
        """A batch for the sticky partition closed: choose another partition for what follows."""
        if self._sticky.get(topic) == previous and num_partitions > 1:
            self._sticky[topic] = (previous + 1) % num_partitions
