"""The transaction coordinator service: `core.txn.TransactionCoordinator` wired to this broker.

It owns the `__transaction_state` partitions this broker leads (docs/transactions.md section 1):
- the topic is created through `broker.logs` (so through the controller in a cluster) on the first
  transactional request, with `transaction.state.log.num.partitions` partitions; the count of an
  existing topic wins over the setting (Kafka never changes it either);
- a partition this broker leads is loaded (replayed) before its ids are served
  (COORDINATOR_LOAD_IN_PROGRESS meanwhile, NOT_COORDINATOR for partitions it does not lead); every
  transaction the load finds in Prepare* goes to the marker writer, which is how a kill -9 or a
  leader move resumes it;
- each Transition's record is appended and fsynced (the group commit, whatever write.caching
  says) before `complete`: nothing is answered or installed that a crash could take back;
- timers: the abort sweeper (`transaction.abort.timed.out.transaction.cleanup.interval.ms`) and
  `transactional.id.expiration.ms` removal, plus a leadership check in a cluster.

The coordinator epoch is the partition's leader epoch (`logs.leader`), carried in every marker.
Ownership is the partition's lease (docs/cluster.md): its records are appended under it, so a
coordinator deposed while paused appends nothing; and a partition whose token a newer leader
raised is unloaded before anything is answered from it (`core`), its marker jobs stopped (the
new leader resends them from the Prepare* records).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from oncelog.broker.logs.internal_topic import ensure_internal_topic
from oncelog.broker.txn.add_partitions import AddPartitionsManager
from oncelog.broker.txn.marker_writer import MarkerWriter
from oncelog.core.txn import Answer, MarkerJob, TransactionCoordinator, Transition, TxnConfig
from oncelog.core.txn.log_format import TRANSACTION_STATE_TOPIC
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.records.decode import iter_record_batches
from oncelog.protocol.records.encode import encode_batch

log = logging.getLogger(__name__)
E = ErrorCode

_LOAD_READ_BYTES = 1 << 20
_TICK_MS = 1000  # leadership check and timer resolution
# Timer transitions (timed-out aborts, expired ids' tombstones) appended per step of the event loop:
# the ids a principal made expire together, and 3,000 of them held the loop 0.28 s in one step
SWEEP_PER_STEP = 32


class TxnCoordinatorService:
    def __init__(self, broker, new_producer_id: Callable[[], int]) -> None:
        self.broker = broker
        c = broker.config
        self._new_producer_id = new_producer_id
        self.num_partitions = c["transaction.state.log.num.partitions"]
        self._core = self._make_core(self.num_partitions)
        self.markers = MarkerWriter(broker, self)
        self.partitions = AddPartitionsManager(broker, self)
        self._waiters: dict[str, list[asyncio.Future]] = {}
        self._epochs: dict[int, int] = {}  # partitions loaded or loading -> coordinator epoch
        self._create_lock = asyncio.Lock()
        self._task: asyncio.Task | None = None
        self._abort_interval = c["transaction.abort.timed.out.transaction.cleanup.interval.ms"]
        self._remove_interval = c["transaction.remove.expired.transaction.cleanup.interval.ms"]
        self._next_abort = self._next_remove = 0

    @property
    def core(self) -> TransactionCoordinator:
        """The coordinator's state, once the partitions whose token a newer leader raised are
        unloaded: what is answered from it comes only from partitions this broker still owns
        (docs/cluster.md; a lock-free read of each loaded partition's token)."""
        logs = self.broker.logs
        for p in [p for p in self._epochs if logs.get_partition(TRANSACTION_STATE_TOPIC, p) is None]:
            self._unload(p)
        return self._core

    def _make_core(self, partitions: int) -> TransactionCoordinator:
        c = self.broker.config
        return TransactionCoordinator(self._new_producer_id, TxnConfig(
            max_timeout_ms=c["transaction.max.timeout.ms"],
            transactional_id_expiration_ms=c["transactional.id.expiration.ms"],
            two_phase_commit_enable=c["transaction.two.phase.commit.enable"],
            num_partitions=partitions, offsets_topic_partitions=c["offsets.topic.num.partitions"]))

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        now = self.broker.now_ms()
        self._next_abort = now + self._abort_interval
        self._next_remove = now + self._remove_interval
        self.reconcile()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.markers.stop()
        self.partitions.close()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(min(_TICK_MS, self._abort_interval, self._remove_interval) / 1000)
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("transaction coordinator maintenance failed; will retry")

    async def tick(self) -> None:
        """The timers, a `__transaction_state` partition at a time and `SWEEP_PER_STEP`
        transitions at a time (Kafka's removal, too, goes partition by partition), other requests
        served between two."""
        self.reconcile()
        now = self.broker.now_ms()
        sweeps: list[Callable[[int, int], list[Transition]]] = []
        if now >= self._next_abort:
            self._next_abort = now + self._abort_interval
            sweeps.append(self._core.expire_timed_out)
        if now >= self._next_remove:
            self._next_remove = now + self._remove_interval
            sweeps.append(self._core.expire_transactional_ids)
        for sweep in sweeps:
            for p in sorted(self._core.owned()):
                transitions = sweep(now, p)
                expired = [t.transactional_id for t in transitions if t.after is None]
                for t in transitions:
                    if t.after is not None:
                        log.info("transaction %s (producer id %d) timed out: aborting at epoch %d",
                                 t.transactional_id, t.after.producer_id, t.after.producer_epoch)
                if expired:   # one line, not one per id (Kafka's "Completed removal of N expired ...")
                    log.info("%d transactional id(s) of %s-%d expired (transactional.id.expiration.ms): %s%s",
                             len(expired), TRANSACTION_STATE_TOPIC, p, ", ".join(expired[:5]),
                             ", ..." if len(expired) > 5 else "")
                for start in range(0, len(transitions), SWEEP_PER_STEP):
                    await asyncio.gather(*(self.run(t) for t in transitions[start:start + SWEEP_PER_STEP]))
                await asyncio.sleep(0)

    # ------------------------------------------------------------------ ownership
    @property
    def topic_exists(self) -> bool:
        return TRANSACTION_STATE_TOPIC in self.broker.logs.topics

    async def ensure_topic(self) -> int:
        """Create `__transaction_state` on first need. NONE, or the code to answer meanwhile."""
        if self.topic_exists:
            return E.NONE
        overrides = {"segment.bytes": str(self.broker.config["transaction.state.log.segment.bytes"]),
                     # records are fsynced before they count, whatever the default says
                     "write.caching": "false",
                     # as Kafka: the cleaner keeps each id's latest record (the loader's
                     # last-record-wins), expired ids go with their tombstones
                     "cleanup.policy": "compact"}
        code = await ensure_internal_topic(self.broker.logs, self._create_lock, TRANSACTION_STATE_TOPIC,
                                           self.num_partitions, overrides, self.broker.now_ms())
        if code == E.NONE:
            self.reconcile()
        return code

    def reconcile(self) -> None:
        """Load the partitions this broker now leads, unload those it no longer leads."""
        info = self.broker.logs.topics.get(TRANSACTION_STATE_TOPIC)
        if info is None:
            return
        if info.partitions != self._core.config.num_partitions:
            # The topic's count wins over the setting; nothing is loaded yet at this point.
            for p in list(self._epochs):
                self._unload(p)
            self._core = self._make_core(info.partitions)
        logs = self.broker.logs
        loaded: list[tuple[int, int, int, int]] = []   # (partition, epoch, records, jobs)
        for p in range(info.partitions):
            partition = logs.get_partition(TRANSACTION_STATE_TOPIC, p)
            held = self._epochs.get(p)
            if partition is None:
                if held is not None:
                    self._unload(p)
                continue
            _leader, epoch = logs.leader(TRANSACTION_STATE_TOPIC, p)
            if held != epoch:
                loaded.append((p, epoch, *self._load(p, partition, epoch)))
        if loaded:
            # one line for what a start loads (50 partitions by default), not one per partition
            epochs = sorted({e for _p, e, _r, _j in loaded})
            log.info("coordinating %d partition(s) of %s (%s) at epoch%s %s: %d records, %d transactions "
                     "to complete", len(loaded), TRANSACTION_STATE_TOPIC, _ranges([p for p, *_ in loaded]),
                     "s" if len(epochs) > 1 else "", ",".join(map(str, epochs)),
                     sum(r for *_x, r, _j in loaded), sum(j for *_x, j in loaded))

    def _unload(self, p: int) -> None:
        log.info("no longer coordinating %s-%d", TRANSACTION_STATE_TOPIC, p)
        self._epochs.pop(p, None)
        self._core.unload(p)
        self.markers.drop_partition(p)

    def _load(self, p: int, partition, epoch: int) -> tuple[int, int]:
        """Replay the partition's records; returns (records replayed, transactions to complete).
        Synchronous: the partition's ids answer COORDINATOR_LOAD_IN_PROGRESS only if a request
        could arrive mid-load, and none can."""
        if p in self._epochs:
            self.markers.drop_partition(p)
        self._epochs[p] = epoch
        self._core.begin_load(p, epoch)
        offset, end, records = partition.log_start_offset, partition.high_watermark, 0
        try:
            while offset < end:
                chunk = partition.read(offset, _LOAD_READ_BYTES)
                moved = False
                for header, batch in iter_record_batches(chunk):
                    if header.last_offset < offset:
                        continue
                    moved = True
                    offset = header.last_offset + 1
                    if header.is_control:
                        continue
                    for r in batch:
                        if r.key is not None:
                            self._core.replay(p, r.key, r.value)
                            records += 1
                if not moved:
                    break
        except (ValueError, KafkaProtocolError) as e:
            # A record no coordinator wrote (or unreadable bytes): serve what was read before it,
            # as Kafka's loader stops at a corrupt record, and say so loudly.
            log.error("%s-%d: loading stopped at offset %d: %s", TRANSACTION_STATE_TOPIC, p, offset, e)
        jobs = self._core.finish_load(p, epoch, self.broker.now_ms())
        log.debug("coordinating %s-%d at epoch %d: %d records, %d transactions to complete",
                  TRANSACTION_STATE_TOPIC, p, epoch, records, len(jobs))
        for job in jobs:
            self.markers.submit(job)
        return records, len(jobs)

    def owns(self, partition: int, coordinator_epoch: int) -> bool:
        return self.core.owned().get(partition) == coordinator_epoch

    def coordinator_node(self, transactional_id: str) -> tuple[int, str, int] | None:
        """(node id, host, port) of the leader of the id's partition, None while none leads it."""
        p = self._core.partition_of(transactional_id)
        node, _epoch = self.broker.logs.leader(TRANSACTION_STATE_TOPIC, p)
        if node == self.broker.node_id:
            return node, self.broker.advertised_host, self.broker.advertised_port
        for b in self.broker.logs.brokers:
            if b.node_id == node:
                return b.node_id, b.host, b.port
        return None

    # ------------------------------------------------------------------ requests
    def coordinates(self, transactional_id: str) -> bool:
        """This broker serves the id (it leads its partition, loaded)."""
        core = self.core
        return core.partition_of(transactional_id) in core.owned()

    async def transition_done(self, transactional_id: str, timeout_s: float) -> None:
        """Wait until a transition of the id completes or fails (or `timeout_s` passes): what a
        request told CONCURRENT_TRANSACTIONS waits for before it asks again."""
        if self._core.pending(transactional_id) is None:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(transactional_id, []).append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            pass
        finally:
            waiters = self._waiters.get(transactional_id)
            if waiters is not None and waiter in waiters:
                waiters.remove(waiter)
                if not waiters:
                    del self._waiters[transactional_id]

    def _wake(self, transactional_id: str) -> None:
        for waiter in self._waiters.pop(transactional_id, ()):
            if not waiter.done():
                waiter.set_result(None)

    async def execute(self, decision: Answer | Transition) -> Answer:
        """A `prepare_*` result: an answer as is, a transition appended then completed."""
        if isinstance(decision, Answer):
            return decision
        reply = await self.run(decision)
        return reply if reply is not None else Answer(E.NOT_COORDINATOR)

    async def run(self, t: Transition) -> Answer | None:
        error = await self.append(t)
        if error:
            log.warning("%s-%d: appending %s for %s failed: %s", TRANSACTION_STATE_TOPIC, t.partition,
                        t.target.display_name, t.transactional_id, ErrorCode(error).name)
            answer = self._core.abort_pending(t, error)
            self._wake(t.transactional_id)
            return answer
        done = self._core.complete(t, self.broker.now_ms())
        if done.markers is not None:
            self.markers.submit(done.markers)
        self._wake(t.transactional_id)
        return done.reply

    def complete(self, t: Transition) -> None:
        """A Complete* transition the marker writer appended."""
        self._core.complete(t, self.broker.now_ms())
        self._wake(t.transactional_id)

    async def append(self, t: Transition) -> int:
        """Append the transition's record and wait for its fsync: NONE or the append's error."""
        partition = self.broker.logs.get_partition(TRANSACTION_STATE_TOPIC, t.partition)
        if partition is None:
            return E.NOT_LEADER_OR_FOLLOWER
        now = self.broker.now_ms()
        key, value = t.record()
        result = partition.append_from_client(encode_batch([(0, now, key, value)]), now)
        if result.error_code:
            return result.error_code
        durable = self.broker.group_commit.durable(partition, result.last_offset + 1)
        if durable is not None and not await durable:
            return E.KAFKA_STORAGE_ERROR
        return E.NONE

    def submitted_jobs(self) -> list[MarkerJob]:
        return self.markers.jobs()


def _ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    out: list[str] = []
    for n in sorted(numbers):
        if out and "-" in out[-1] and int(out[-1].split("-")[1]) == n - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        elif out and "-" not in out[-1] and int(out[-1]) == n - 1:
            out[-1] = f"{out[-1]}-{n}"
        else:
            out.append(str(n))
    return ",".join(out)
