"""Kafka's default partitioner: murmur2 of the key bytes, sign bit cleared, modulo partitions.

Same arithmetic as `org.apache.kafka.common.utils.Utils.murmur2` / `toPositive`, so a keyed record
lands on the same partition as with the Java client (and librdkafka's `murmur2_random`).
Keyless records use sticky partitioning (KIP-480, KIP-794): see StickyPartitioner.
"""
from __future__ import annotations

import random
import time
from bisect import bisect_right
from collections.abc import Callable
from itertools import accumulate

from oncelog.protocol.records import BATCH_OVERHEAD

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
    """Kafka's built-in partitioner (KIP-794, `BuiltInPartitioner`) for records without a key
    (or with `partitioner.ignore.keys`): a topic's records go to one partition until a batch's
    worth (`batch.size`) went there, then to a partition drawn at random — the first one too, so
    that producers do not all start on partition 0.

    The switch is decided by a byte count kept as the records are partitioned, on whatever
    thread sends them: Kafka switches once a batch fills, but here batches are built later on
    the sender's thread. Counting with the accumulator's size bounds against the room of a
    batch makes each stay on a partition fill one batch (Kafka's `enableSwitch` also defers the
    switch while the partition's last batch is not full; that refinement is not done here).

    Adaptive partitioning (`partitioner.adaptive.partitioning.enable`): `load(topic, n)` gives,
    for the partitions with a leader, how many batches wait in each queue; the draw is weighted
    by `max + 1 - queued`, so that partitions whose brokers drain slowly get fewer records.
    Computed once per `load_ttl_ms` per topic, not per switch."""

    def __init__(self, batch_size: int = 16384, *, ignore_keys: bool = False,
                 load: Callable[[str, int], tuple[list[int], list[int]] | None] | None = None,
                 rng: random.Random | None = None, load_ttl_ms: float = 10.0) -> None:
        self.ignore_keys = ignore_keys
        self._room = max(1, batch_size - BATCH_OVERHEAD)
        self._sticky: dict[str, list] = {}   # topic -> [partition, bytes of room left]
        self._rng = rng if rng is not None else random.Random()
        self._load = load
        self._load_ttl_s = load_ttl_ms / 1000
        self._weights: dict[str, tuple[float, list[int] | None, list[int] | None]] = {}

    def partition(self, topic: str, key: bytes | None, num_partitions: int, size: int = 1) -> int:
        """The partition of one record; `size` is its size bound (as the accumulator counts)."""
        if key is not None and not self.ignore_keys:
            return partition_for_key(key, num_partitions)
        s = self._sticky.get(topic)
        # the first step of sticky_runs, inlined for the per-record path: the record fits what
        # is left of the current partition's batch
        if s is not None and size <= s[1] and s[0] < num_partitions:
            s[1] -= size
            return s[0]
        return self.sticky_runs(topic, num_partitions, (size,))[0][0]

    def sticky_runs(self, topic: str, num_partitions: int, ends) -> list[tuple[int, int]]:
        """Partitions of consecutive keyless records in one call, for columnar writers: `ends[i]`
        is the summed size bound of records 0..i (any sequence bisect can search, such as a numpy
        cumsum). Returns runs `(partition, stop)`: the records from the previous run's stop up to
        `stop` go to `partition`. The work is per switch, not per record, and the state is the
        one `partition` keeps, so both kinds of caller share a topic's stay."""
        runs: list[tuple[int, int]] = []
        count, start, base = len(ends), 0, 0
        s = self._sticky.get(topic)
        while start < count:
            fresh = s is None or s[0] >= num_partitions
            if s is None or fresh:
                s = self._switch(topic, num_partitions)
            stop = bisect_right(ends, base + s[1], start)   # the records that fit what is left
            if stop == start and not fresh:
                s = self._switch(topic, num_partitions)
                stop = bisect_right(ends, base + s[1], start)
            if stop == start:
                stop = start + 1        # any record fits an empty batch (and stays alone there)
            top = int(ends[stop - 1])
            s[1] -= top - base
            runs.append((s[0], stop))
            start, base = stop, top
        return runs

    def _switch(self, topic: str, n: int) -> list[int]:
        s = self._sticky[topic] = [self._next(topic, n), self._room]
        return s

    def _next(self, topic: str, n: int) -> int:
        r = self._rng.getrandbits(31)
        if self._load is not None:
            cft, ids = self._weights_for(topic, n)
            if cft is not None and ids is not None:
                return ids[bisect_right(cft, r % cft[-1])]
        return r % n

    def _weights_for(self, topic: str, n: int) -> tuple[list[int] | None, list[int] | None]:
        now = time.monotonic()
        w = self._weights.get(topic)
        if w is not None and now < w[0]:
            return w[1], w[2]
        cft = ids = None
        stats = self._load(topic, n) if self._load is not None else None
        if stats is not None:
            queued, ids = stats
            top = max(queued, default=0) + 1
            # all equal with every partition available: a uniform draw (Kafka does the same)
            if queued and (len(ids) < n or queued.count(top - 1) != len(queued)):
                cft = list(accumulate(top - q for q in queued))
        self._weights[topic] = (now + self._load_ttl_s, cft, ids)
        return cft, ids
