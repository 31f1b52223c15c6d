"""The group coordinator's group commit for its record logs (`storage.group_records`): a KIP-848
group's records, a group's committed offsets, a producer's pending transactional offsets.

A request that changed one of them wrote its records without an fsync (page cache) and waits here
until an fsync covered them: the produce path's `GroupCommit`, on threads of its own, sees each
log as a partition, so at most one fsync (or compaction) per log is in flight, off the event loop,
and one fsync answers every append that came meanwhile (issue 36: every OffsetCommit and
TxnOffsetCommit fsynced on the event loop, and compactions ran there too). A failed fsync cuts
what it covered off the file and its waiters are told False: their requests answer
NOT_COORDINATOR, and what memory held of the log is read again from the file.
"""
from __future__ import annotations

from collections.abc import Callable

from oncelog.broker.logs.fsync_batcher import GroupCommit
from oncelog.storage.group_records import RecordLog

# fsync threads (the share groups and the produce path have their own)
SYNC_THREADS = 2


class RecordSync:
    def __init__(self, now_ms: Callable[[], int], threads: int = SYNC_THREADS) -> None:
        self.commit = GroupCommit(now_ms, threads=threads)

    async def flushed(self, log: RecordLog | None) -> bool:
        """True once everything appended to `log` so far is on disk (at once when it is, or when
        there is no log); False if a failure cut it away (or the log was dropped meanwhile)."""
        if log is None:
            return True
        if log.offline:
            return False
        waiting = self.commit.durable(log, log.writes)
        return True if waiting is None else bool(await waiting)

    def close(self) -> None:
        """The broker stops: the fsyncs in flight end; whoever still waits is told False."""
        self.commit.close()
