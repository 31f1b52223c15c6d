"""Packed maps from producer id for producer state: `PidIndex` (id -> dense slot, the table every
lookup goes through) and `ExpiredProducers` (ids whose state left the table -> where their
batches are in the log).

Both are arrays, not a Python object per producer. The hash is keyed: a key drawn at random per
table (by the caller) is mixed into every id, so no client can choose ids that share a probe chain.
"""
from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator, Sequence
from typing import NamedTuple

_M64 = (1 << 64) - 1
_EMPTY = -1


def _mix(pid: int, key: int) -> int:
    # splitmix64's finalizer over pid + key: every bit of the id moves every bit of the result,
    # and without the key a client cannot tell which ids share a home slot.
    x = (pid + key) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


class PidIndex:
    """Producer id -> dense slot 0..n-1: the ids in `pids` (array q) and an open-addressing table
    of slots (array i, at most 3/4 full, linear probing, backward-shift deletion)."""

    __slots__ = ("pids", "_table", "_bits", "_key")

    def __init__(self, key: int, pids: array[int] | None = None) -> None:
        self._key = key & _M64
        self.pids = array("q") if pids is None else pids
        self._build(check=True)

    def _build(self, check: bool = False) -> None:
        bits = 4
        while len(self.pids) * 4 > (3 << bits):
            bits += 1
        self._bits = bits
        table = self._table = array("i", [_EMPTY]) * (1 << bits)
        for s, pid in enumerate(self.pids):
            i = self._probe(pid)[0]
            if check and table[i] != _EMPTY:
                raise ValueError(f"producer {pid} listed twice")
            table[i] = s

    def __len__(self) -> int:
        return len(self.pids)

    def _home(self, pid: int) -> int:
        return _mix(pid, self._key) >> (64 - self._bits)

    def _probe(self, pid: int) -> tuple[int, int]:
        """(table position holding `pid`'s slot, or the empty entry ending its chain; entries read)."""
        table, pids, mask = self._table, self.pids, (1 << self._bits) - 1
        i, n = self._home(pid), 1
        s = table[i]
        while s != _EMPTY and pids[s] != pid:
            i, n = (i + 1) & mask, n + 1
            s = table[i]
        return i, n

    def find(self, pid: int) -> int:
        """`pid`'s slot, or -1."""
        return self._table[self._probe(pid)[0]]

    def probe_length(self, pid: int) -> int:
        """Table entries a lookup of `pid` reads (tests show that chosen ids cannot lengthen it)."""
        return self._probe(pid)[1]

    def add(self, pid: int) -> int:
        """Append `pid` (not present) and return its slot; the caller appends its other columns."""
        s = len(self.pids)
        self.pids.append(pid)
        if (s + 1) * 4 > (3 << self._bits):
            self._build()
        else:
            self._table[self._probe(pid)[0]] = s
        return s

    def remove(self, s: int) -> int:
        """Swap-remove slot `s`: the last slot's id moves into `s`. Returns that last slot; the
        caller moves its own columns from it to `s` (when they differ) and drops their last row."""
        table, pids, mask = self._table, self.pids, (1 << self._bits) - 1
        i = self._probe(pids[s])[0]
        table[i] = _EMPTY
        j = i
        while True:  # backward shift: no tombstones, lookups stay short
            j = (j + 1) & mask
            t = table[j]
            if t == _EMPTY:
                break
            k = self._home(pids[t])
            # the entry at j may fill the hole at i unless its home lies cyclically in (i, j]
            if (i < k <= j) if i <= j else (k > i or k <= j):
                continue
            table[i] = t
            table[j] = _EMPTY
            i = j
        last = len(pids) - 1
        if s != last:
            table[self._probe(pids[last])[0]] = s
            pids[s] = pids[last]
        pids.pop()
        return last

    def keep(self, mask: list[bool]) -> None:
        """Keep only the slots whose flag is set (order preserved); the caller filters its columns alike."""
        self.pids = array("q", (p for p, k in zip(self.pids, mask) if k))
        self._build()

    def memory_bytes(self) -> int:
        return sys.getsizeof(self.pids) + sys.getsizeof(self._table)


class Remembered(NamedTuple):
    """Where a remembered producer's batches are in the log."""
    offsets: tuple[int, ...]  # base offsets of the batches it retained, oldest first
    end: int                  # the last offset of its newest batch (what its client last had acknowledged, at most)


class ExpiredProducers:
    """Producers whose state left the table -- expired after producer.id.expiration.ms, or
    evicted at producer.state.max.producers.per.partition -- while their batches may still be in
    the log: pid -> the base offset of each batch it retained (up to `stride`) and the last offset
    of its newest batch. A batch from one of them is restored from those batches (storage reads
    each batch's header through the offset index) before it is judged, so that an idle producer
    continues in sequence and a retry arriving later -- even one at sequence 0 -- is answered as
    the duplicate it is. Producer ids never seen are not here, so their batches cost no read.

    At most `capacity` are kept (producer.state.max.remembered.producers.per.partition); beyond
    it those whose newest batch is oldest are forgotten first, in bulk down to 9/10 of it, and
    `watermark` rises to the highest last offset they had. A forgotten producer then meets
    UNKNOWN_PRODUCER_ID, answered with a log start offset above the watermark, so its client sees
    state lost as to retention (reset and continue), not data loss (the seed's rule).

    Columns: pid (via PidIndex) 8 B, batch count 2 B, end 8 B and `stride` base offsets of 8 B."""

    def __init__(self, key: int, capacity: int, stride: int) -> None:
        self.capacity = capacity
        self.stride = stride
        self.watermark = -1   # highest `end` of a producer forgotten for capacity; -1: none
        self.forgotten = 0    # forgotten for capacity (metrics, logs)
        self._key = key
        self._index = PidIndex(key)
        self._count = array("H")
        self._end = array("q")
        self._offsets = array("q")

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, pid: int) -> bool:
        return self._index.find(pid) >= 0

    def _at(self, s: int) -> Remembered:
        base = s * self.stride
        return Remembered(tuple(self._offsets[base:base + self._count[s]]), self._end[s])

    def get(self, pid: int) -> Remembered | None:
        s = self._index.find(pid)
        return None if s < 0 else self._at(s)

    def add(self, pid: int, offsets: Sequence[int], end: int) -> None:
        """Remember `pid`'s batches at `offsets` (oldest first; the newest `stride` are kept)."""
        stride = self.stride
        offsets = offsets[-stride:]
        row = array("q", offsets)
        row.extend(array("q", bytes(8 * (stride - len(row)))))
        s = self._index.find(pid)
        if s < 0:
            self._index.add(pid)
            self._count.append(len(offsets))
            self._end.append(end)
            self._offsets.extend(row)
        else:
            self._count[s], self._end[s] = len(offsets), end
            self._offsets[s * stride:(s + 1) * stride] = row

    def pop(self, pid: int) -> Remembered | None:
        s = self._index.find(pid)
        if s < 0:
            return None
        found = self._at(s)
        last = self._index.remove(s)
        stride = self.stride
        if s != last:
            self._count[s], self._end[s] = self._count[last], self._end[last]
            self._offsets[s * stride:(s + 1) * stride] = self._offsets[last * stride:(last + 1) * stride]
        self._count.pop()
        self._end.pop()
        del self._offsets[last * stride:]
        return found

    def shed(self) -> int:
        """Forget down to 9/10 of the capacity when above it, lowest `end` first (in bulk, so the
        sort is amortised), and raise the watermark to the highest `end` forgotten."""
        n = len(self)
        if n <= self.capacity:
            return 0
        target = self.capacity * 9 // 10
        threshold = sorted(self._end)[n - target - 1]
        dropped = self._keep([e > threshold for e in self._end])
        self.watermark = max(self.watermark, threshold)
        self.forgotten += dropped
        return dropped

    def forget_outside(self, start: int, end: int | None = None) -> int:
        """Forget those whose newest batch the log no longer holds: its last offset below `start`
        (deleted), or (with `end`, after a truncation) its base offset at or above `end`. There is
        nothing to restore them from, and UNKNOWN_PRODUCER_ID is the right answer. A truncation
        also lowers the watermark below the new log end: what lay above it is lost for real."""
        if end is not None:
            self.watermark = min(self.watermark, end - 1)
        if not len(self):
            return 0
        ends = self._end
        if end is None:
            if min(ends) >= start:
                return 0
            return self._keep([e >= start for e in ends])
        stride, offsets, count = self.stride, self._offsets, self._count
        return self._keep([e >= start and offsets[s * stride + count[s] - 1] < end for s, e in enumerate(ends)])

    def _keep(self, mask: list[bool]) -> int:
        before, stride = len(self), self.stride
        self._index.keep(mask)
        self._count = array("H", (c for c, k in zip(self._count, mask) if k))
        self._end = array("q", (e for e, k in zip(self._end, mask) if k))
        offsets = array("q")
        for s, k in enumerate(mask):
            if k:
                offsets.extend(self._offsets[s * stride:(s + 1) * stride])
        self._offsets = offsets
        return before - len(self)

    def relayout(self, stride: int) -> None:
        """A new window: keep each producer's newest `stride` batches."""
        if stride == self.stride:
            return
        old, offsets, count = self.stride, array("q"), self._count
        pad = array("q", bytes(8 * stride))
        for s in range(len(self)):
            keep = min(count[s], stride)
            row = self._offsets[s * old + count[s] - keep:s * old + count[s]]
            offsets.extend(row)
            offsets.extend(pad[:stride - keep])
            count[s] = keep
        self._offsets, self.stride = offsets, stride

    def items(self) -> Iterator[tuple[int, Remembered]]:
        for s, pid in enumerate(self._index.pids):
            yield pid, self._at(s)

    def columns(self) -> tuple[array[int], array[int], array[int], array[int]]:
        """pid, batch count, end, and the base offsets (`stride` per producer)."""
        return self._index.pids, self._count, self._end, self._offsets

    def load(self, stride: int, pids: array[int], count: array[int], end: array[int], offsets: array[int],
             watermark: int) -> None:
        n = len(pids)
        if not (len(count) == len(end) == n and len(offsets) == n * stride) or stride < 1:
            raise ValueError("remembered-producer columns disagree in length")
        if any(not 1 <= c <= stride for c in count):
            raise ValueError("remembered-producer batch counts out of range")
        self._index = PidIndex(self._key, array("q", pids))  # raises on a producer listed twice
        self._count, self._end, self._offsets = array("H", count), array("q", end), array("q", offsets)
        self.stride, self.watermark = stride, watermark

    def memory_bytes(self) -> int:
        return self._index.memory_bytes() + sum(sys.getsizeof(a) for a in (self._count, self._end, self._offsets))
