"""A partition's side of transactions, sans-IO: open transactions, the last stable offset, and the
aborted-transaction index (Kafka's ProducerStateManager txn part, CompletedTxn, TransactionIndex).

Storage calls, around each append, the same methods at run time and when recovery replays the log:
- a data batch: `check_data_batch` before (a non-transactional batch from a producer with an open
  transaction is INVALID_TXN_STATE), `on_data_batch` after the append (a producer's first
  transactional batch opens its transaction at that offset);
- a COMMIT/ABORT marker: `prepare_marker` (pure: the `CompletedTxn`, with the LSO to record for an
  abort), then, once the marker is in the log and the abort in the segment's `AbortedTxnIndex`,
  `complete`. A marker for a producer with no open transaction completes nothing (a repeated
  marker, or a transaction that wrote nothing here).

LSO = min(first offset of any open transaction, first offset of any completed transaction whose
marker is not yet below the high watermark, high watermark), never below the log start offset.

Layout: open transactions are a dict pid -> first offset plus a queue of (first, pid) in offset
order, pruned lazily from the front and rebuilt from the dict when stale entries pile up behind a
long transaction, so the earliest open transaction is O(1) amortised and memory O(open). Completed
transactions wait for the high watermark in a queue in marker order; few do, since the high
watermark trails the log end only by the group commit in flight. Index entries are four int64
arrays per segment, sorted by last offset (markers are appended in offset order), so a fetch
bisects to its first candidate instead of scanning the segment's index from the start.
"""
from __future__ import annotations

import struct
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from oncelog.protocol.errors import ErrorCode

NO_OFFSET = -1
INDEX_VERSION = 0
ENTRY = struct.Struct(">hqqqq")  # version, producer id, first offset, last offset, last stable offset
ENTRY_SIZE = ENTRY.size  # 34, Kafka's AbortedTxn.TOTAL_SIZE
_COMPACT_AT = 1024


class CompletedTxn(NamedTuple):
    """A transaction closed by a marker at `last_offset` (Kafka's CompletedTxn), with the last
    stable offset at completion (recorded in the aborted-transaction index for aborts)."""
    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool
    last_stable_offset: int


class AbortedTxn(NamedTuple):
    """One entry of a segment's `.txnindex`; what Fetch returns is (producer_id, first_offset)."""
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class PartitionTxns:
    """Open and not-yet-stable transactions of one partition."""

    def __init__(self) -> None:
        self._open: dict[int, int] = {}  # pid -> first offset of its open transaction
        self._q_first = array("q")        # open transactions in offset order (stale ones pruned lazily)
        self._q_pid = array("q")
        self._q_head = 0
        self._c_marker = array("q")       # completed, marker not yet below the high watermark,
        self._c_first = array("q")        # in marker order
        self._c_head = 0

    # ------------------------------------------------------------------ queries
    def open_first_offset(self, producer_id: int) -> int:
        return self._open.get(producer_id, NO_OFFSET)

    def has_open(self, producer_id: int) -> bool:
        """Producers with an open transaction never expire (producer.id.expiration.ms)."""
        return producer_id in self._open

    def __len__(self) -> int:
        return len(self._open)

    def open_transactions(self) -> list[tuple[int, int]]:
        """(pid, first offset) in offset order: what a producer-state snapshot keeps."""
        return sorted(self._open.items(), key=lambda kv: kv[1])

    def _prune_open(self) -> None:
        first, pid, h, n = self._q_first, self._q_pid, self._q_head, len(self._q_first)
        while h < n and self._open.get(pid[h]) != first[h]:
            h += 1
        self._q_head = h
        if h >= _COMPACT_AT and h * 2 >= n:
            del first[:h], pid[:h]
            self._q_head = 0

    def first_undecided_offset(self) -> int:
        """The first offset of the earliest open transaction, or NO_OFFSET."""
        self._prune_open()
        return self._q_first[self._q_head] if self._q_head < len(self._q_first) else NO_OFFSET

    def _prune_completed(self, high_watermark: int) -> None:
        marker, h, n = self._c_marker, self._c_head, len(self._c_marker)
        while h < n and marker[h] < high_watermark:
            h += 1
        self._c_head = h
        if h >= _COMPACT_AT and h * 2 >= n:
            del self._c_marker[:h], self._c_first[:h]
            self._c_head = 0

    def first_unstable_offset(self, high_watermark: int) -> int:
        """Kafka's firstUnstableOffset, or NO_OFFSET when every transaction is stable."""
        self._prune_completed(high_watermark)
        candidates = [self.first_undecided_offset()]
        if self._c_head < len(self._c_first):
            candidates.append(min(self._c_first[self._c_head:]))
        candidates = [c for c in candidates if c != NO_OFFSET]
        return min(candidates) if candidates else NO_OFFSET

    def last_stable_offset(self, high_watermark: int, log_start_offset: int = 0) -> int:
        first = self.first_unstable_offset(high_watermark)
        lso = high_watermark if first == NO_OFFSET else min(first, high_watermark)
        return max(lso, min(log_start_offset, high_watermark))

    # ------------------------------------------------------------------ appends
    def check_data_batch(self, producer_id: int, is_transactional: bool) -> int:
        """ErrorCode for a batch about to be appended (before the append; changes nothing)."""
        if not is_transactional and producer_id in self._open:
            return ErrorCode.INVALID_TXN_STATE
        return ErrorCode.NONE

    def on_data_batch(self, producer_id: int, base_offset: int, is_transactional: bool) -> None:
        """A batch is in the log (client append, or recovery replay)."""
        if is_transactional and producer_id not in self._open:
            if self._q_head < len(self._q_first) and base_offset < self._q_first[-1]:
                raise ValueError(f"transaction of {producer_id} opens at {base_offset}, "
                                 f"below one opened at {self._q_first[-1]}")
            self._open[producer_id] = base_offset
            self._q_first.append(base_offset)
            self._q_pid.append(producer_id)

    def prepare_marker(self, producer_id: int, marker_offset: int, is_abort: bool) -> CompletedTxn | None:
        """The transaction a marker at `marker_offset` closes (None if the producer has none open
        here). Pure: nothing changes until `complete`."""
        first = self._open.get(producer_id)
        if first is None:
            return None
        return CompletedTxn(producer_id, first, marker_offset, is_abort,
                            self._stable_offset_at(producer_id, marker_offset))

    def _stable_offset_at(self, producer_id: int, marker_offset: int) -> int:
        """Kafka's lastStableOffset(completedTxn): the first offset of the earliest transaction of
        another producer still open, else the offset after the marker."""
        self._prune_open()
        first, pid, opened = self._q_first, self._q_pid, self._open
        for k in range(self._q_head, len(first)):
            # Stale entries skipped here sit right behind the head and are pruned once this
            # producer's transaction completes, so the walk is paid for once.
            if pid[k] != producer_id and opened.get(pid[k]) == first[k]:
                return first[k]
        return marker_offset + 1

    def complete(self, txn: CompletedTxn) -> None:
        """The marker is in the log (and an abort in the segment's index): close the transaction."""
        if self._open.get(txn.producer_id) != txn.first_offset:
            raise ValueError(f"no open transaction of {txn.producer_id} at {txn.first_offset}")
        del self._open[txn.producer_id]
        self._c_marker.append(txn.last_offset)
        self._c_first.append(txn.first_offset)
        self._prune_open()
        if len(self._q_first) - self._q_head > 2 * len(self._open) + _COMPACT_AT:
            # Short transactions completing behind a long one leave stale entries the head cannot
            # reach; rebuild from the dict, whose order is the order transactions opened in.
            self._q_first = array("q", self._open.values())
            self._q_pid = array("q", self._open.keys())
            self._q_head = 0

    # ------------------------------------------------------------------ snapshots, truncation
    def load(self, open_transactions: Iterable[tuple[int, int]]) -> None:
        """Replace the state with a snapshot's open transactions (completed ones are stable by
        then: a snapshot is taken at or below the high watermark)."""
        self.__init__()  # type: ignore[misc]
        for pid, first in sorted(open_transactions, key=lambda kv: kv[1]):
            if pid in self._open:
                raise ValueError(f"producer {pid} has two open transactions in the snapshot")
            self.on_data_batch(pid, first, True)

    def on_log_start_offset(self, log_start_offset: int) -> None:
        """Retention moved the log start: completed transactions wholly below it are forgotten."""
        self._prune_completed(log_start_offset)


# ---------------------------------------------------------------------- the aborted-transaction index

class AbortedTxnIndex:
    """The aborted transactions whose markers lie in one segment, packed (Kafka's TransactionIndex)."""

    __slots__ = ("pid", "first", "last", "lso")

    def __init__(self) -> None:
        self.pid, self.first, self.last, self.lso = array("q"), array("q"), array("q"), array("q")

    def __len__(self) -> int:
        return len(self.pid)

    def append(self, txn: CompletedTxn | AbortedTxn) -> None:
        if isinstance(txn, CompletedTxn) and not txn.is_aborted:
            raise ValueError("only aborted transactions are indexed")
        if self.last and txn.last_offset < self.last[-1]:
            raise ValueError(f"index entries must follow their markers: {txn.last_offset} < {self.last[-1]}")
        self.pid.append(txn.producer_id)
        self.first.append(txn.first_offset)
        self.last.append(txn.last_offset)
        self.lso.append(txn.last_stable_offset)

    def entries(self) -> Iterator[AbortedTxn]:
        for k in range(len(self.pid)):
            yield AbortedTxn(self.pid[k], self.first[k], self.last[k], self.lso[k])

    def truncate_to(self, offset: int) -> None:
        """The log was truncated to end at `offset`: markers at or above it are gone."""
        k = bisect_left(self.last, offset)
        del self.pid[k:], self.first[k:], self.last[k:], self.lso[k:]

    # -------------------------------------------------------------- bytes (the .txnindex file)
    def encode(self) -> bytes:
        return b"".join(ENTRY.pack(INDEX_VERSION, *e) for e in self.entries())

    def encode_from(self, k: int) -> bytes:
        """Bytes of entries k.. (what an append adds to the file)."""
        return b"".join(ENTRY.pack(INDEX_VERSION, self.pid[i], self.first[i], self.last[i], self.lso[i])
                        for i in range(k, len(self.pid)))

    @classmethod
    def decode(cls, data: bytes) -> AbortedTxnIndex:
        """Entries of a `.txnindex` file; a torn final entry (a crash mid-write) is dropped.
        ValueError for an unknown entry version or entries out of marker order."""
        idx = cls()
        usable = len(data) - len(data) % ENTRY_SIZE
        for version, pid, first, last, lso in ENTRY.iter_unpack(memoryview(data)[:usable]):
            if version != INDEX_VERSION:
                raise ValueError(f"unknown aborted-transaction index entry version {version}")
            if first > last:
                raise ValueError(f"aborted transaction of {pid} ends ({last}) before it starts ({first})")
            idx.append(AbortedTxn(pid, first, last, lso))
        return idx

    # -------------------------------------------------------------- the fetch query
    def collect(self, fetch_offset: int, upper: int, out: list[AbortedTxn], budget: int) -> tuple[bool, int, int]:
        """Add entries with last >= fetch_offset and first < upper to `out` (Kafka's
        collectAbortedTxns). Returns (complete, entries scanned, highest LSO seen); complete once
        an entry's LSO reaches `upper` (no later entry can start below it)."""
        k = bisect_left(self.last, fetch_offset)
        n = len(self.pid)
        scanned, best = 0, NO_OFFSET
        first, lso = self.first, self.lso
        while k < n and scanned < budget:
            if first[k] < upper:
                out.append(AbortedTxn(self.pid[k], first[k], self.last[k], lso[k]))
            scanned += 1
            if lso[k] > best:
                best = lso[k]
            if lso[k] >= upper:
                return True, scanned, best
            k += 1
        return False, scanned, best


class AbortedQuery(NamedTuple):
    """The aborted transactions a read_committed Fetch returns, complete up to `upper`."""
    transactions: list[AbortedTxn]
    upper: int


def collect_aborted(indexes: Iterable[AbortedTxnIndex], fetch_offset: int, upper: int,
                    max_scan: int | None = None) -> AbortedQuery:
    """The aborted transactions overlapping [fetch_offset, upper), walking the indexes of the
    segment holding `fetch_offset` and the later ones, in order.

    With `max_scan`, at most that many entries are read; if the answer is not complete by then,
    `upper` comes back lowered to the highest LSO seen, below which the list is complete (the
    caller shortens the read to it). It can only fail to progress (upper <= fetch_offset) while
    one transaction stayed open across more than `max_scan` aborts of other producers; the caller
    then asks again without the bound.
    """
    out: list[AbortedTxn] = []
    left = max_scan if max_scan is not None else 2**62
    best = NO_OFFSET
    for idx in indexes:
        done, scanned, seen = idx.collect(fetch_offset, upper, out, left)
        best = max(best, seen)
        if done:
            return AbortedQuery(out, upper)
        left -= scanned
        if left <= 0:
            bound = min(upper, best)
            return AbortedQuery([t for t in out if t.first_offset < bound], bound)
    return AbortedQuery(out, upper)
