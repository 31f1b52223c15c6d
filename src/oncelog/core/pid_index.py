"""Packed maps from producer id for producer state: `PidIndex` (id -> dense slot, the table every
lookup goes through) and `ExpiredProducers` (expired ids -> where their batches are in the log).

Both are arrays, not a Python object per producer. The hash is keyed: a key drawn at random per
table (by the caller) is mixed into every id, so no client can choose ids that share a probe chain.
"""
from __future__ import annotations

import sys
from array import array
from typing import Iterator

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

    def __init__(self, key: int, pids: array | None = None) -> None:
        self._key = key & _M64
        self.pids = array("q") if pids is None else pids
        self._build(check=True)

    def _build(self, check: bool = False) -> None:
        bits = 4
        while len(self.pids) * 4 > (3 << bits):
            bits += 1
        self._bits = bits
        self._table = array("i", [_EMPTY]) * (1 << bits)
        for s, pid in enumerate(self.pids):
            if check and self.find(pid) >= 0:
                raise ValueError(f"producer {pid} listed twice")
            self._put(pid, s)

    def __len__(self) -> int:
        return len(self.pids)

    def _home(self, pid: int) -> int:
        return _mix(pid, self._key) >> (64 - self._bits)

    def find(self, pid: int) -> int:
        table, pids, mask = self._table, self.pids, (1 << self._bits) - 1
        i = self._home(pid)
        while True:
            s = table[i]
            if s == _EMPTY:
                return -1
            if pids[s] == pid:
                return s
            i = (i + 1) & mask

    def probe_length(self, pid: int) -> int:
        """Table entries a lookup of `pid` reads (tests show that chosen ids cannot lengthen it)."""
        table, pids, mask = self._table, self.pids, (1 << self._bits) - 1
        i, n = self._home(pid), 1
        while table[i] != _EMPTY and pids[table[i]] != pid:
            i, n = (i + 1) & mask, n + 1
        return n

    def _put(self, pid: int, slot: int) -> None:
        table, mask = self._table, (1 << self._bits) - 1
        i = self._home(pid)
        while table[i] != _EMPTY:
            i = (i + 1) & mask
        table[i] = slot

    def add(self, pid: int) -> int:
        """Append `pid` (not present) and return its slot; the caller appends its other columns."""
        s = len(self.pids)
        self.pids.append(pid)
        if (s + 1) * 4 > (3 << self._bits):
            self._build()
        else:
            self._put(pid, s)
        return s

    def _index_of(self, pid: int) -> int:
        table, pids, mask = self._table, self.pids, (1 << self._bits) - 1
        i = self._home(pid)
        while pids[table[i]] != pid:
            i = (i + 1) & mask
        return i

    def remove(self, s: int) -> int:
        """Swap-remove slot `s`: the last slot's id moves into `s`. Returns that last slot; the
        caller moves its own columns from it to `s` (when they differ) and drops their last row."""
        table, pids, mask = self._table, self.pids, (1 << self._bits) - 1
        i = self._index_of(pids[s])
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
            table[self._index_of(pids[last])] = s
            pids[s] = pids[last]
        pids.pop()
        return last

    def keep(self, mask: list[bool]) -> None:
        """Keep only the slots whose flag is set (order preserved); the caller filters its columns alike."""
        self.pids = array("q", (p for p, k in zip(self.pids, mask) if k))
        self._build()

    def memory_bytes(self) -> int:
        return sys.getsizeof(self.pids) + sys.getsizeof(self._table)


class ExpiredProducers:
    """Producers removed by expiry whose newest batch may still be in the log: pid -> offsets of
    their oldest and newest retained batch. A batch from one of them is restored from the log
    (storage reads it) before it is judged, so that an idle producer continues in sequence and a
    retry arriving after expiry -- even one at sequence 0 -- is answered as the duplicate it is.
    Producer ids never seen are not here, so their batches cost no read of the log.

    At most `capacity` are kept (the producer cap, at least 100,000: 24 B each plus the table);
    beyond it those with the oldest newest batch are forgotten first (they then meet
    UNKNOWN_PRODUCER_ID, as in Kafka after expiry)."""

    def __init__(self, key: int, capacity: int) -> None:
        self.capacity = capacity
        self._index = PidIndex(key)
        self._oldest = array("q")
        self._newest = array("q")
        self.forgotten = 0  # dropped for capacity (metrics, logs)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, pid: int) -> bool:
        return self._index.find(pid) >= 0

    def get(self, pid: int) -> tuple[int, int] | None:
        """(oldest, newest) batch offsets of an expired producer, or None."""
        s = self._index.find(pid)
        return None if s < 0 else (self._oldest[s], self._newest[s])

    def add(self, pid: int, oldest: int, newest: int) -> None:
        s = self._index.find(pid)
        if s < 0:
            self._index.add(pid)
            self._oldest.append(oldest)
            self._newest.append(newest)
        else:
            self._oldest[s], self._newest[s] = oldest, newest

    def pop(self, pid: int) -> tuple[int, int] | None:
        s = self._index.find(pid)
        if s < 0:
            return None
        found = (self._oldest[s], self._newest[s])
        last = self._index.remove(s)
        if s != last:
            self._oldest[s], self._newest[s] = self._oldest[last], self._newest[last]
        self._oldest.pop()
        self._newest.pop()
        return found

    def shed(self) -> int:
        """Forget down to 9/10 of the capacity when above it (in bulk, so the sort is amortised)."""
        n = len(self)
        if n <= self.capacity:
            return 0
        target = self.capacity * 9 // 10
        threshold = sorted(self._newest)[n - target - 1] if target < n else -1
        dropped = self._keep([o > threshold for o in self._newest])
        self.forgotten += dropped
        return dropped

    def forget_outside(self, start: int, end: int | None = None) -> int:
        """Forget those whose newest batch is below `start` (or at/after `end`): the log no longer
        holds it, so there is nothing to restore and UNKNOWN_PRODUCER_ID is the right answer."""
        if not len(self):
            return 0
        newest = self._newest
        if end is None:
            if min(newest) >= start:
                return 0
            return self._keep([o >= start for o in newest])
        return self._keep([start <= o < end for o in newest])

    def _keep(self, mask: list[bool]) -> int:
        before = len(self)
        self._index.keep(mask)
        self._oldest = array("q", (o for o, k in zip(self._oldest, mask) if k))
        self._newest = array("q", (o for o, k in zip(self._newest, mask) if k))
        return before - len(self)

    def items(self) -> Iterator[tuple[int, tuple[int, int]]]:
        for s, pid in enumerate(self._index.pids):
            yield pid, (self._oldest[s], self._newest[s])

    def columns(self) -> tuple[array, array, array]:
        return self._index.pids, self._oldest, self._newest

    def load(self, pids: array, oldest: array, newest: array) -> None:
        if not len(pids) == len(oldest) == len(newest):
            raise ValueError("expired-producer columns disagree in length")
        self._index = PidIndex(self._index._key, array("q", pids))
        self._oldest, self._newest = array("q", oldest), array("q", newest)

    def memory_bytes(self) -> int:
        return self._index.memory_bytes() + sys.getsizeof(self._oldest) + sys.getsizeof(self._newest)
