"""Group commit: an acks=all Produce is answered once its batch is fsynced, and one fsync covers
every append that arrived while the previous one ran.

Per partition at most one fsync is in flight, on a small thread pool, so the event loop never
waits for the disk. When it returns, the answers it covers go out and, if more was appended
meanwhile, the next fsync starts at once: under load each fsync covers a group of requests, at
rest a lone request pays for one. Storage owns the files (`Partition.begin_sync / run_sync /
end_sync`); this module owns only the scheduling and the waiting.

Topics with `write.caching=true` do not come here for their answers (those go out from the page
cache); their flush policy (flush.ms / flush.messages) does, so that a periodic fsync does not
block the loop either. Consumers of other topics see records once they are fsynced (the high
watermark is the durable end), so each completed fsync wakes waiting fetches.

A failed fsync is storage's business: the partition cuts what was not synced and rebuilds its
producer state, or goes offline. Here it means that waiters whose records were cut (or whose
partition went offline) are told False, and their requests answer KAFKA_STORAGE_ERROR.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)

FSYNC_THREADS = 4


class GroupCommit:
    def __init__(self, now_ms: Callable[[], int], on_durable: Callable[[], None] = lambda: None,
                 threads: int = FSYNC_THREADS) -> None:
        self._now_ms = now_ms
        self._on_durable = on_durable
        # Threads of our own that wait on a queue (started at the first fsync): an fsync is one
        # put, its end one call_soon_threadsafe. A thread pool's futures, locks and the chaining
        # of its future to the loop's cost a lone small Produce more than its own handling did.
        self._threads_wanted = threads
        self._threads: list[threading.Thread] = []
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._syncing: set = set()       # partitions with an fsync in flight
        self._waiters: dict = {}         # partition -> deque[(offset, generation, future or callback)]
        self._closed = False
        self.fsyncs = 0                  # completed fsyncs (for metrics and tests)

    def appended(self, partition) -> None:
        """Records were appended (or a storage error may have cut some): have them fsynced."""
        self._settle(partition)
        if partition not in self._syncing:
            self._start(partition)

    def durable(self, partition, offset: int) -> asyncio.Future | None:
        """None when every record below `offset` is fsynced already; otherwise a future that
        becomes True once they are, or False once a failure cut them away."""
        if partition.durable_end_offset >= offset:
            return None
        future = asyncio.get_running_loop().create_future()
        self._wait(partition, offset, future)
        return future

    def when_durable(self, partition, offset: int, callback: Callable[[bool], None]) -> bool:
        """`durable` for a caller that wants no loop hop (`broker.net.later`): False when every
        record below `offset` is fsynced already; otherwise True, and `callback(kept)` is called
        as the fsync's outcome is known, from the loop, before anything else runs."""
        if partition.durable_end_offset >= offset:
            return False
        self._wait(partition, offset, callback)
        return True

    def waiting(self, partition) -> int:
        """Answers waiting for the partition's records to be fsynced (for tests and metrics)."""
        return len(self._waiters.get(partition, ()))

    def settle_all(self) -> None:
        """After work that may have cut a log outside a request (the periodic flush)."""
        for partition in list(self._waiters):
            self._settle(partition)

    def close(self) -> None:
        """Stop starting fsyncs; wait for those in flight (the logs close after this)."""
        self._closed = True
        for _thread in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()
        self._threads.clear()
        for waiting in self._waiters.values():
            for _offset, _generation, waiter in waiting:
                _tell(waiter, False)
        self._waiters.clear()

    # ------------------------------------------------------------------ internals
    def _wait(self, partition, offset: int, waiter) -> None:
        queue = self._waiters.get(partition)
        if queue is None:
            queue = self._waiters[partition] = deque()
        queue.append((offset, partition.sync_generation, waiter))
        if partition not in self._syncing:
            self._start(partition)

    def _start(self, partition) -> None:
        if self._closed:
            return
        token = partition.begin_sync(self._now_ms())
        if token is None:
            self._settle(partition)  # offline, or nothing left: answer whoever still waits
            return
        self._syncing.add(partition)
        if not self._threads:
            for i in range(self._threads_wanted):
                thread = threading.Thread(target=self._worker, name=f"oncelog-fsync-{i}", daemon=True)
                thread.start()
                self._threads.append(thread)
        self._jobs.put((asyncio.get_running_loop(), partition, token))

    def _worker(self) -> None:
        """A thread's loop: fsync what it is given, hand the outcome back to the event loop."""
        jobs = self._jobs
        while (job := jobs.get()) is not None:
            loop, partition, token = job
            try:
                partition.run_sync(token)
                error = None
            except BaseException as e:  # noqa: BLE001 - the loop decides what a failed fsync means
                error = e
            try:
                loop.call_soon_threadsafe(self._done, partition, token, error)
            except RuntimeError:   # the loop is closed: nobody waits any more
                pass

    def _done(self, partition, token, error: BaseException | None) -> None:
        self._syncing.discard(partition)
        if self._closed:
            return
        partition.end_sync(token, error, self._now_ms())
        self.fsyncs += 1
        self._settle(partition)
        if error is None:
            self._on_durable()
        self._start(partition)  # what arrived while this one ran

    def _settle(self, partition) -> None:
        queue = self._waiters.get(partition)
        if not queue:
            return
        durable, generation, offline = partition.durable_end_offset, partition.sync_generation, partition.offline
        while queue:
            offset, since, waiter = queue[0]
            if offset <= durable:
                ok = True
            elif since != generation or offline:
                ok = False  # cut by a failed fsync since it was appended, or never to be synced
            else:
                break
            queue.popleft()
            _tell(waiter, ok)
        if not queue:
            del self._waiters[partition]


def _tell(waiter, kept: bool) -> None:
    if isinstance(waiter, asyncio.Future):
        if not waiter.done():
            waiter.set_result(kept)
        return
    try:
        waiter(kept)
    except Exception:  # noqa: BLE001 - one waiter's bug must not leave the others waiting
        log.exception("a group commit waiter failed")
