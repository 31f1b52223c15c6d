"""A read_committed consumer's filter over one partition's fetched batches (Kafka's CompletedFetch;
kafka-python and aiokafka do the same): batch-level, no per-record work.

The Fetch response lists the aborted transactions (producer id, first offset) overlapping the
returned data. Walking the batches in offset order, a transaction joins the aborting set once the
walk reaches its first offset; its ABORT marker removes it; a transactional batch of a producer in
the set is skipped. Control batches are never returned but stepped over, so offsets have gaps.
"""
from __future__ import annotations

from collections.abc import Iterable


class ReadCommittedFilter:
    __slots__ = ("_aborted", "_next", "_aborting")

    def __init__(self, aborted: Iterable[tuple[int, int]]) -> None:
        """`aborted`: (producer_id, first_offset) pairs, as the Fetch response carries them."""
        self._aborted = sorted(aborted, key=lambda t: t[1])
        self._next = 0
        self._aborting: set[int] = set()

    def accept(self, producer_id: int, last_offset: int, is_transactional: bool, is_control: bool,
               is_abort_marker: bool = False) -> bool:
        """Whether the records of this batch reach the application."""
        aborted, k = self._aborted, self._next
        while k < len(aborted) and aborted[k][1] <= last_offset:
            self._aborting.add(aborted[k][0])
            k += 1
        self._next = k
        if is_control:
            if is_abort_marker:
                self._aborting.discard(producer_id)
            return False
        return not (is_transactional and producer_id in self._aborting)
