"""The marker writer: for each MarkerJob, a COMMIT/ABORT marker on every partition of the
transaction, then the job's Complete* transition (docs/transactions.md section 2).

Never losing a marker: the Prepare* record is durable before a job exists, the Complete* record
is appended only once every partition acknowledged a fsynced marker, and until then the id's
Complete* transition is pending (no new transaction can start). A crash or a leader move leaves
Prepare* in `__transaction_state`; the loader hands the job back here and every marker is written
again, which is harmless where one already was.

Per partition (`core.txn.markers.classify`): done, retried with backoff (a moved leader, a
storage error), or the job stops (a newer producer epoch or coordinator owns the id). Partitions
of `__consumer_offsets` are the group coordinator's: the marker makes the group's pending
transactional offsets visible (COMMIT) or drops them (ABORT).

Local partitions only: a partition led by another broker of a cluster needs WriteTxnMarkers to
that broker, which is not built yet; such a partition is retried until this broker leads it.
"""
from __future__ import annotations

import asyncio
import logging
from functools import partial

from oncelog.core.txn import MarkerJob
from oncelog.core.txn.log_format import CONSUMER_OFFSETS_TOPIC, partition_for
from oncelog.core.txn.markers import MarkerOutcome, MarkerProgress
from oncelog.protocol.errors import ErrorCode

log = logging.getLogger(__name__)
E = ErrorCode

BACKOFF_MS = 50
MAX_BACKOFF_MS = 2000


class MarkerWriter:
    def __init__(self, broker, service) -> None:
        self.broker = broker
        self.service = service
        self._tasks: dict[tuple[int, str], tuple[MarkerJob, asyncio.Task]] = {}

    def submit(self, job: MarkerJob) -> None:
        key = (job.completion.partition, job.transactional_id)
        old = self._tasks.pop(key, None)
        if old is not None:
            old[1].cancel()
        task = asyncio.create_task(self._run(job))
        self._tasks[key] = (job, task)
        task.add_done_callback(partial(self._forget, key))

    def _forget(self, key: tuple[int, str], task: asyncio.Task[None]) -> None:
        current = self._tasks.get(key)
        if current is not None and current[1] is task:
            del self._tasks[key]

    def jobs(self) -> list[MarkerJob]:
        return [job for job, _task in self._tasks.values()]

    def drop_partition(self, partition: int) -> None:
        """This broker no longer coordinates that `__transaction_state` partition: its new owner
        resends the markers from the Prepare* records."""
        for key in [k for k in self._tasks if k[0] == partition]:
            self._tasks.pop(key)[1].cancel()

    async def stop(self) -> None:
        tasks = [t for _j, t in self._tasks.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()

    def _current(self, job: MarkerJob) -> bool:
        return self.service.owns(job.completion.partition, job.coordinator_epoch)

    async def _run(self, job: MarkerJob) -> None:
        progress = MarkerProgress(job)
        backoff = BACKOFF_MS
        while progress.left:
            if not self._current(job):
                return
            for tp in sorted(progress.left):
                code = await self._write(job, tp)
                outcome = progress.on_result(tp, code)
                if outcome is MarkerOutcome.UNEXPECTED:
                    log.error("marker for %s (producer id %d) on %s-%d: unexpected %s; retrying",
                              job.transactional_id, job.producer_id, tp[0], tp[1], ErrorCode(code).name)
                elif outcome is MarkerOutcome.STOP:
                    log.warning("marker for %s (producer id %d) on %s-%d refused with %s: a newer "
                                "producer or coordinator owns it; the transaction stays in %s",
                                job.transactional_id, job.producer_id, tp[0], tp[1], ErrorCode(code).name,
                                "PrepareCommit" if job.commit else "PrepareAbort")
                    return
            if progress.left:
                await asyncio.sleep(backoff / 1000)
                backoff = min(MAX_BACKOFF_MS, backoff * 2)
        backoff = BACKOFF_MS
        while self._current(job):
            # Kafka's txnLogAppendRetryQueue: the markers are written, so only Complete* is left.
            error = await self.service.append(job.completion)
            if not error:
                self.service.complete(job.completion)
                return
            log.warning("appending %s for %s failed (%s); retrying", job.completion.target.display_name,
                        job.transactional_id, ErrorCode(error).name)
            await asyncio.sleep(backoff / 1000)
            backoff = min(MAX_BACKOFF_MS, backoff * 2)

    async def _write(self, job: MarkerJob, tp: tuple[str, int]) -> int:
        topic, index = tp
        broker = self.broker
        if topic == CONSUMER_OFFSETS_TOPIC:
            return self._offsets_marker(job, index)
        info = broker.logs.topics.get(topic)
        if info is None or index >= info.partitions:
            return E.NONE  # deleted with its topic: no reader needs a marker there
        code = await broker.logs.write_txn_marker(topic, index, job.producer_id, job.producer_epoch,
                                                  job.coordinator_epoch, job.commit)
        if code:
            return code
        partition = broker.logs.get_partition(topic, index)
        if partition is None:
            return E.NOT_LEADER_OR_FOLLOWER
        # Acknowledged only once fsynced: Complete* must never be durable before its markers.
        durable = broker.group_commit.durable(partition, partition.log_end_offset)
        if durable is not None and not await durable:
            return E.KAFKA_STORAGE_ERROR
        broker.data_appended()
        return E.NONE

    def _offsets_marker(self, job: MarkerJob, index: int) -> int:
        groups = self.broker.groups
        if groups is None:
            return E.COORDINATOR_NOT_AVAILABLE
        n = self.broker.config["offsets.topic.num.partitions"]
        groups.complete_txn(job.producer_id, job.commit, lambda g: partition_for(g, n) == index)
        return E.NONE
