"""The marker writer: for each MarkerJob, a COMMIT/ABORT marker on every partition of the
transaction, then the job's Complete* transition (docs/transactions.md section 2).

Never losing a marker: the Prepare* record is durable before a job exists, the Complete* record
is appended only once every partition acknowledged a fsynced marker, and until then the id's
Complete* transition is pending (no new transaction can start). A crash or a leader move leaves
Prepare* in `__transaction_state`; the loader hands the job back here and every marker is written
again, which is harmless where one already was.

Per partition (`core.txn.marker_progress.classify`): done, retried with backoff (a moved leader, a
storage error), or the job stops (a newer producer epoch or coordinator owns the id). Partitions
of `__consumer_offsets` are the group coordinator's: the marker makes the group's pending
transactional offsets visible (COMMIT) or drops them (ABORT).

Partitions this broker leads are written by a direct call (no socket); a partition another
broker leads (the broker's metadata view says which) goes to that broker in WriteTxnMarkers v1,
through one channel per destination that carries the markers of every job waiting for it in one
request (Kafka's TransactionMarkerChannelManager). A refused or lost request is retried after
backoff, with the leader looked up again, so a kill -9 or a leader move of the data partition's
broker only delays its markers; one of the coordinator drops the jobs (`drop_partition`), and its
successor resends them from the Prepare* records.

Markers go to the owner of each partition only (docs/cluster.md): `__consumer_offsets-N` too,
whose leader coordinates N's groups (`broker.groups.ownership`) and applies the marker under N's
lease; a broker that does not own a partition any more answers NOT_LEADER_OR_FOLLOWER and the
marker is sent again to whoever leads it then. Each marker carries its transaction's version
(WriteTxnMarkers v2, KIP-1228): a partition takes a Transactions V2 marker only above the
producer's epoch while its transaction is open there, so a copy of a marker that arrives late (a
request that waited in a paused broker's socket) cannot settle the producer's next transaction.
"""
from __future__ import annotations

import asyncio
import collections
import logging
from functools import partial

from oncelog.broker.cluster.peers import Peers, PeerUnavailable
from oncelog.core.txn import MarkerJob
from oncelog.core.txn.log_format import CONSUMER_OFFSETS_TOPIC
from oncelog.core.txn.marker_progress import MarkerOutcome, MarkerProgress
from oncelog.core.txn.state import TopicPartition
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

log = logging.getLogger(__name__)
E = ErrorCode

BACKOFF_MS = 50
MAX_BACKOFF_MS = 2000
MARKERS_VERSION = 2   # KIP-1228: each marker says its transaction's version
# Local markers in flight at once, for all transactions together, hence appended per step of the
# event loop (a marker costs 0.3-1 ms): a transaction of a client that may write to many partitions
# wrote them all in one step (1,000: 0.5 s that no other client was served), as did many
# transactions aborted together
LOCAL_MARKERS_PER_STEP = 32


class MarkerWriter:
    def __init__(self, broker, service) -> None:
        self.broker = broker
        self.service = service
        self._tasks: dict[tuple[int, str], tuple[MarkerJob, asyncio.Task]] = {}
        self.peers = Peers(broker, "oncelog-txn-markers")
        self._channels: dict[int, _Channel] = {}
        self._local_slots = _Slots(LOCAL_MARKERS_PER_STEP)

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
        for channel in self._channels.values():
            await channel.stop()
        self._channels.clear()
        self.peers.close()

    def _current(self, job: MarkerJob) -> bool:
        return self.service.owns(job.completion.partition, job.coordinator_epoch)

    async def _run(self, job: MarkerJob) -> None:
        progress = MarkerProgress(job)
        backoff = BACKOFF_MS
        while progress.left:
            if not self._current(job):
                return
            for tp, code in (await self._write_all(job, sorted(progress.left))).items():
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

    async def _write_all(self, job: MarkerJob, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """One round: every partition left, local ones written directly, the others sent to their
        leaders, all at once (one group-commit fsync covers the local markers of a log)."""
        broker = self.broker
        codes: dict[TopicPartition, int] = {}
        local: list[TopicPartition] = []
        remote: dict[int, list[TopicPartition]] = {}
        for tp in tps:
            topic, index = tp
            if topic == CONSUMER_OFFSETS_TOPIC:
                leader = broker.logs.leader(topic, index)[0] if broker.config["oncelog.cluster"] else broker.node_id
                if leader == broker.node_id:
                    codes[tp] = offsets_marker(broker, job.producer_id, job.producer_epoch, job.coordinator_epoch,
                                               job.commit, index, job.transaction_version)
                elif leader < 0:
                    codes[tp] = E.NOT_LEADER_OR_FOLLOWER
                else:
                    remote.setdefault(leader, []).append(tp)
                continue
            info = broker.logs.topics.get(topic)
            if info is None or index >= info.partitions:
                codes[tp] = E.NONE  # deleted with its topic: no reader needs a marker there
                continue
            leader, _epoch = broker.logs.leader(topic, index)
            if leader == broker.node_id:
                local.append(tp)
            elif leader < 0:
                codes[tp] = E.NOT_LEADER_OR_FOLLOWER  # none leads it now: retried after backoff
            else:
                remote.setdefault(leader, []).append(tp)
        waits = [self._local(job, tp) for tp in local]
        waits += [self._channel(node).send(job, parts) for node, parts in remote.items()]
        for answer in await asyncio.gather(*waits):
            codes.update(answer)
        return codes

    async def _local(self, job: MarkerJob, tp: TopicPartition) -> dict[TopicPartition, int]:
        # Acknowledged only once fsynced (write_txn_marker waits for it): Complete* must never be
        # durable before its markers. A slot is held until then: the markers that wait for one are
        # appended in later steps of the event loop, once the fsync of those before them is done.
        await self._local_slots.acquire()
        try:
            code = await self.broker.logs.write_txn_marker(tp[0], tp[1], job.producer_id, job.producer_epoch,
                                                           job.coordinator_epoch, job.commit,
                                                           job.transaction_version)
        finally:
            self._local_slots.release()
        if not code:
            self.broker.data_appended()
        return {tp: code}

    def _channel(self, node: int) -> _Channel:
        channel = self._channels.get(node)
        if channel is None:
            channel = self._channels[node] = _Channel(self.peers, node)
        return channel



def offsets_marker(broker, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                   index: int, transaction_version: int = 0) -> int:
    """The marker of `__consumer_offsets-<index>`, checked as a data partition checks a marker;
    taken, the pending transactional offsets of the producer's groups on that partition become
    visible (COMMIT) or are dropped (ABORT). Also what the WriteTxnMarkers handler does for such
    a partition. NOT_LEADER_OR_FOLLOWER unless this broker owns the partition (its lease)."""
    groups, ownership = broker.groups, broker.group_ownership
    if groups is None or ownership is None:
        return E.COORDINATOR_NOT_AVAILABLE
    if not ownership.owns_partition(index):
        return E.NOT_LEADER_OR_FOLLOWER
    code: int = groups.complete_txn(producer_id, producer_epoch, coordinator_epoch, commit, index,
                                    transaction_version)
    return code


class _Slots:
    """At most `size` holders at once, the others served first come first served. asyncio's
    Semaphore scans its waiters at every acquire (quadratic in the markers of one transaction:
    2,000 of them took 0.2 s in one step); here a slot is handed from holder to waiter directly."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def acquire(self) -> None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()          # handed a slot just as it was cancelled: pass it on
            elif waiter in self._waiters:   # (a release may have passed over it already)
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot goes to it
                return
        self._free += 1


class _Channel:
    """Markers waiting for one destination broker. At most one WriteTxnMarkers is in flight; what
    queues meanwhile, from any number of jobs, goes in the next one."""

    def __init__(self, peers: Peers, node: int) -> None:
        self.peers, self.node = peers, node
        self._queue: list[tuple[MarkerJob, list[TopicPartition], asyncio.Future]] = []
        self._task: asyncio.Task | None = None

    async def send(self, job: MarkerJob, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        future: asyncio.Future[dict[TopicPartition, int]] = asyncio.get_running_loop().create_future()
        self._queue.append((job, tps, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._queue:
            batch = [item for item in self._queue if not item[2].done()]  # a cancelled job's wait is done
            self._queue = []
            if not batch:
                continue
            try:
                answers = await self._request(batch)
            except (PeerUnavailable, KafkaProtocolError, ValueError) as e:
                log.info("WriteTxnMarkers to broker %d failed (%s); retrying", self.node, e)
                answers = [{tp: E.NETWORK_EXCEPTION for tp in tps} for _job, tps, _f in batch]
            for (_job, _tps, future), answer in zip(batch, answers):
                if not future.done():
                    future.set_result(answer)

    async def _request(self, batch) -> list[dict[TopicPartition, int]]:
        from oncelog.protocol import entities
        mod = entities.module(ApiKey.WRITE_TXN_MARKERS, MARKERS_VERSION, "request")
        markers = []
        for job, tps, _f in batch:
            by_topic: dict[str, list[int]] = {}
            for topic, index in tps:
                by_topic.setdefault(topic, []).append(index)
            markers.append(entities.make(
                mod.WritableTxnMarker, producer_id=job.producer_id, producer_epoch=job.producer_epoch,
                transaction_result=job.commit, coordinator_epoch=job.coordinator_epoch,
                transaction_version=job.transaction_version,
                topics=tuple(entities.make(mod.WritableTxnMarkerTopic, name=t, partition_indexes=tuple(ps))
                             for t, ps in by_topic.items())))
        r = await self.peers.request(self.node, ApiKey.WRITE_TXN_MARKERS, MARKERS_VERSION, markers=tuple(markers))
        answers = []
        for i, (job, tps, _f) in enumerate(batch):
            # results come in request order (Kafka's handler keeps it); a missing one is retried
            result = r.markers[i] if i < len(r.markers) and int(r.markers[i].producer_id) == job.producer_id else None
            got = {} if result is None else {(str(t.name), int(p.partition_index)): int(p.error_code)
                                             for t in result.topics for p in t.partitions}
            answers.append({tp: got.get(tp, E.NETWORK_EXCEPTION) for tp in tps})
        return answers

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for _job, _tps, future in self._queue:
            future.cancel()
        self._queue.clear()
