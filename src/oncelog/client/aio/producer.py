"""The asyncio producer: the API (`send`, `flush`, `close`) over the pieces that do the work.

- `ProducerCore` (client/producer_core.py) makes every decision, without I/O: batching, sequences,
  retries, in-flight limits, InitProducerId outcomes, buffer admission;
- `Handoff` (handoff.py) brings records from the caller's thread into the core's accumulator;
- `Sender` (sender.py) is the loop-thread task that sends what the core lets go and feeds the core
  the answers;
- `Delivery` (delivery.py) reports completed batches to futures and callbacks, and wakes flushes
  and senders waiting for buffer.memory;
- `ProducerMetadata` (metadata.py) loads topics and passes leaders and connections to the core.

The core and the accumulator are guarded by one threading lock (`lock`), taken by the loop
thread for each pass and answer, and by other threads only for the few calls they make."""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from threading import get_ident
from typing import Any

from oncelog.client.aio.cluster import Cluster
from oncelog.client.aio.delivery import Delivery
from oncelog.client.aio.handoff import ENCODED, Handoff, TxnHandoff
from oncelog.client.aio.metadata import ProducerMetadata
from oncelog.client.aio.sender import Sender, Wakeup, now_ms
from oncelog.client.config import Idempotence, ProducerConfig
from oncelog.client.errors import (
    BufferExhaustedError,
    KafkaClientError,
    ProducerClosedError,
    RecordTooLargeError,
    TransactionStateError,
    TransactionTimeoutError,
)
from oncelog.client.partitioner import StickyPartitioner
from oncelog.client.producer_core import ProducerCore
from oncelog.client.txn_core import PreparedTxnState, TransactionManager, TxnResult
from oncelog.client.types import ConsumerGroupMetadata, RecordMetadata, TopicPartition
from oncelog.protocol.api import ApiKey
from oncelog.protocol.records import BATCH_OVERHEAD, RECORD_OVERHEAD, record_size_upper_bound

log = logging.getLogger("oncelog.client.producer")


def _bytes(v) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"key/value must be bytes, str or None, not {type(v).__name__}")


def _settle(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class AIOProducer:
    """`await AIOProducer(config).start()`, then `await send(...)` -> asyncio future of
    RecordMetadata; `flush()`, `close()`. `append`/`append_encoded` may be called from any
    thread (the synchronous facade's `send`)."""

    def __init__(self, config: dict) -> None:
        self.raw_config = dict(config)
        self.config = c = ProducerConfig.from_dict(config)
        self.core = ProducerCore(c)
        self.txn: TransactionManager | None = None
        if c.transactional_id is not None:
            self.txn = TransactionManager(c.transactional_id,
                                          transaction_timeout_ms=c.transaction_timeout_ms,
                                          retry_backoff_ms=c.retry_backoff_ms, producer=self.core,
                                          allow_v2=c.transaction_v2, two_phase_commit=c.two_phase_commit)
        # calls whose caller timed out, by operation: made again, they return its outcome
        self._txn_calls: dict[str, TxnResult] = {}
        self.lock = threading.Lock()
        self.cluster = Cluster(c.bootstrap_servers, c.client_id, c.request_timeout_ms,
                               allow_auto_create=c.allow_auto_create_topics,
                               address_map=c.address_map, security=c.security)
        self.wakeup = Wakeup()
        self.delivery = Delivery(self.lock)
        self.metadata = ProducerMetadata(self.core, self.lock, c, self.cluster, self.wakeup)
        if self.txn is None:
            self.handoff = Handoff(self.core, self.lock, self.wakeup, c.batch_size, c.linger_ms)
        else:
            self.handoff = TxnHandoff(self.core, self.lock, self.wakeup, c.batch_size, c.linger_ms,
                                      self.txn)
            # the instance's `append` checks the transaction first; the class's stays as it was
            self.append = self._append_in_transaction  # type: ignore[method-assign]
        self.sender = Sender(self.core, self.lock, c, self.cluster, self.delivery, self.wakeup,
                             self.handoff)
        self.partitioner = StickyPartitioner(
            c.batch_size, ignore_keys=c.partitioner_ignore_keys,
            load=self.metadata.partition_load if c.partitioner_adaptive else None)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._loop_ident = -1
        self._closing = False
        self._close_task: asyncio.Future | None = None
        # read on every append: bound here once rather than looked up through their owners
        self._partition_counts = self.metadata.partitions
        self._tps = self.metadata.tps
        self._max_record_size = c.max_request_size - BATCH_OVERHEAD

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> AIOProducer:
        self.loop = asyncio.get_running_loop()
        self._loop_ident = threading.get_ident()
        conn = await self.cluster.any_connection()
        await self.cluster.refresh([])
        pv = conn.version(ApiKey.PRODUCE)
        self.metadata.is_ours = pv is not None and pv >= 14
        if pv is None:
            raise KafkaClientError(f"broker {conn.addr} cannot take Produce v3+ (record batch v2)")
        with self.lock:
            if ApiKey.INIT_PRODUCER_ID not in conn.versions:
                self.core.broker_lacks_idempotence("no InitProducerId in ApiVersions")
        if self.core.fatal is not None:
            raise self.core.fatal
        self.sender.start(self.loop)
        if self.core.idempotent and self.txn is None:   # transactional: init_transactions asks
            # learn now whether the broker grants a producer id, so that `required` fails at
            # construction and `requested` falls back before the first record
            deadline = time.monotonic() + self.config.max_block_ms / 1000
            while self.core.idempotent and self.core.producer_id < 0 and self.core.fatal is None:
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.005)
            if self.core.fatal is not None:
                raise self.core.fatal
            if (self.core.idempotent and self.core.producer_id < 0
                    and self.config.idempotence is Idempotence.REQUIRED):
                raise KafkaClientError(
                    f"enable.idempotence=required: no producer id from the broker within "
                    f"max.block.ms={self.config.max_block_ms}")
        return self

    async def __aenter__(self) -> AIOProducer:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def flush(self, timeout: float | None = None) -> None:
        """Return once every record sent before the call is complete — its future done and its
        callback run, delivered or failed (Java's flush). Records sent meanwhile are not waited
        for. While any flush waits, batches go out without lingering. asyncio.TimeoutError if
        `timeout` (seconds) passes first."""
        self.handoff.take(now_ms())   # records other threads sent before this call
        with self.lock:
            done = self.core.take_completions()
            # completed batches not yet delivered were just taken: delivered below
            batches = self.core.incomplete_batches()
            self.core.acc.flushing += 1
        try:
            self.delivery.deliver(done)
            if batches:
                self.wakeup.set()
                await self.delivery.wait_for(batches, timeout)
        finally:
            with self.lock:
                self.core.acc.flushing -= 1

    async def close(self, timeout: float | None = None) -> None:
        """Send what was handed over (up to `timeout` seconds), then fail what is left: every
        record reaches its future or callback exactly once. A batch still on the wire fails with
        ProducerClosedError saying that it may have been written; an answer that comes later is
        ignored."""
        if self._close_task is None:
            self._close_task = asyncio.ensure_future(self._close(timeout))
        await asyncio.shield(self._close_task)

    async def _close(self, timeout: float | None) -> None:
        self._closing = True
        try:
            if self.sender.started:
                # also after a fatal error: batches on the wire are still answered (Java waits too)
                await self.flush(timeout)
        except TimeoutError:
            log.warning("close: records not delivered within %.1fs are failed", timeout)
        finally:
            self.handoff.close(now_ms())
            with self.lock:
                if self.txn is not None:
                    self.txn.close()
                self.core.fail_all(
                    ProducerClosedError("producer closed before delivery"),
                    ProducerClosedError("producer closed while the records' outcome was unknown: "
                                        "they may or may not have been written"))
                done = self.core.take_completions()
            self.delivery.deliver(done)
            await self.sender.stop()
            self.metadata.cancel()
            self.cluster.close()

    @property
    def closed(self) -> bool:
        """close() was called (or is under way): nothing more can be sent."""
        return self._closing

    # ------------------------------------------------------------------ sending

    async def send(self, topic: str, value=None, key=None, headers=None, partition: int | None = None,
                   timestamp: int | None = None, on_delivery: Callable | None = None) -> asyncio.Future:
        """Queue a record; returns a future of its RecordMetadata."""
        assert self.loop is not None, "start() the producer first"
        fut = self.loop.create_future()
        while True:
            r = self.append(topic, value, key, headers, partition, timestamp, (fut, on_delivery))
            if r:
                return fut
            if r is None:
                await self.ensure_topic(topic)
                continue
            try:
                await asyncio.wait_for(self.delivery.memory_freed(), self.config.max_block_ms / 1000)
            except TimeoutError:
                raise BufferExhaustedError(
                    f"buffer.memory={self.config.buffer_memory} full for max.block.ms="
                    f"{self.config.max_block_ms}") from None

    async def send_and_wait(self, topic: str, value=None, key=None, **kw) -> RecordMetadata:
        return await (await self.send(topic, value, key, **kw))

    def append(self, topic: str, value, key, headers, partition, timestamp, cookie: Any
               ) -> bool | None:
        """Thread-safe: add a record. False when buffer.memory is full, None when the topic's
        metadata is not loaded yet (`ensure_topic`); nothing was added in either case.

        The per-record path of every send: the topic's readiness comes from the lookup that
        gives its partition count, a value or key is converted only if its class is not bytes,
        the size bound of a record without headers and the partition's TopicPartition (when
        known) are found here, without a call."""
        n = self._partition_counts.get(topic)
        if n is None:
            return None
        if self._closing:
            raise ProducerClosedError("producer is closed")
        if value.__class__ is not bytes:
            value = _bytes(value)
        if key is not None and key.__class__ is not bytes:
            key = _bytes(key)
        if headers:
            headers = [(k if isinstance(k, str) else k.decode(), _bytes(v)) for k, v in
                       (headers.items() if isinstance(headers, dict) else headers)]
            size = record_size_upper_bound(key, value, headers)
        else:
            headers = None
            size = RECORD_OVERHEAD + (len(value) if value else 0) + (len(key) if key else 0)
        if size > self._max_record_size:
            raise RecordTooLargeError(f"record of {size + BATCH_OVERHEAD} bytes exceeds "
                                      f"max.request.size={self.config.max_request_size}")
        if partition is None:
            partition = self.partitioner.partition(topic, key, n, size) if n > 1 else 0
        elif not 0 <= partition < n:
            raise KafkaClientError(f"topic {topic} has {n} partitions, no partition {partition}")
        ts = int(time.time() * 1000) if timestamp is None else int(timestamp)
        tps = self._tps.get(topic)
        tp = tps[partition] if tps is not None and partition < len(tps) else self.metadata.tp(topic, partition)
        if get_ident() == self._loop_ident:
            return self.handoff.append_on_loop(tp, ts, key, value, headers, cookie)
        return self.handoff.hand_over(tp, ts, key, value, headers, cookie, size)

    def _append_in_transaction(self, topic: str, value, key, headers, partition, timestamp,
                               cookie: Any) -> bool | None:
        """`append` for a transactional producer: refused unless a transaction is open; the
        partition joins the transaction when the loop takes the record (TxnHandoff)."""
        txn = self.txn
        assert txn is not None  # installed only for a transactional producer
        if not txn.open_for_records():   # the lock and the checks only to raise the right error
            with self.lock:
                txn.check_send(topic)
        return AIOProducer.append(self, topic, value, key, headers, partition, timestamp, cookie)

    def append_encoded(self, topic: str, partition: int, records, count: int, base_ts: int,
                       max_ts: int, cookie: Any) -> bool:
        """Thread-safe batch-level append (see Producer.send_encoded); False when buffer.memory
        is full."""
        if self._closing:
            raise ProducerClosedError("producer is closed")
        if self.txn is not None:   # per batch, not per record
            with self.lock:
                self.txn.check_send(topic)
        n = self._partition_counts[topic]
        if not 0 <= partition < n:
            raise KafkaClientError(f"topic {topic} has {n} partitions, no partition {partition}")
        if count <= 0:
            raise ValueError("a batch holds at least one record")
        if len(records) + BATCH_OVERHEAD > self.config.max_request_size:
            raise RecordTooLargeError(
                f"batch of {len(records) + BATCH_OVERHEAD} bytes exceeds max.request.size="
                f"{self.config.max_request_size}")
        tp = self.metadata.tp(topic, partition)
        if get_ident() != self._loop_ident:
            # through the handoff like `send`, so that both keep one order per thread
            return self.handoff.hand_over(tp, 0, ENCODED, (records, count, base_ts, max_ts), None,
                                          cookie, BATCH_OVERHEAD + len(records))
        return self.handoff.append_encoded_on_loop(tp, records, count, base_ts, max_ts, cookie)

    def wait_for_memory(self, timeout_s: float) -> None:
        """From a sending thread whose append found buffer.memory full: wait until a batch
        completes or `timeout_s` passes, then try again."""
        self.delivery.wait_for_memory(timeout_s)

    async def ensure_topic(self, topic: str) -> int:
        """Load a topic's metadata and message format once; returns its partition count."""
        return await self.metadata.ensure_topic(topic)

    def partition_count(self, topic: str) -> int | None:
        """The topic's partition count once it is ready to take records, else None."""
        return self._partition_counts.get(topic)

    # ------------------------------------------------------------------ transactions

    def _tm(self) -> TransactionManager:
        if self.txn is None:
            raise TransactionStateError("the producer has no transactional.id")
        return self.txn

    async def init_transactions(self, timeout: float | None = None, keep_prepared_txn: bool = False,
                                expected: tuple[int, int] | None = None) -> None:
        """Find the transaction coordinator and get the producer id and epoch of
        `transactional.id`, fencing any older producer with it and completing its open
        transaction. `timeout` seconds (None: max.block.ms); a timed-out call may be made
        again and resumes. `keep_prepared_txn` (KIP-939, with transaction.two.phase.commit.enable):
        keep the open transaction instead of aborting it, for `complete_transaction`."""
        tm = self._tm()
        await self._txn_call("init_transactions", lambda: tm.init_transactions(keep_prepared_txn, expected),
                             self.config.max_block_ms / 1000 if timeout is None else timeout)

    async def prepare_transaction(self, timeout: float | None = None) -> PreparedTxnState:
        """KIP-939: flush every record of the transaction and leave it open (prepared); the
        returned state is for the external transaction manager to record with its decision."""
        tm = self._tm()
        await self.flush(self._txn_timeout(timeout))
        with self.lock:
            return tm.prepare_transaction()

    @property
    def prepared_transaction(self) -> PreparedTxnState | None:
        """The open transaction init_transactions(keep_prepared_txn=True) kept, or
        prepare_transaction prepared; None when there is none."""
        tm = self._tm()
        with self.lock:
            return tm.prepared

    async def complete_transaction(self, state: PreparedTxnState, timeout: float | None = None) -> bool | None:
        """KIP-939: commit the prepared transaction if `state` names it, else abort it (logged
        as a warning). True: committed; False: aborted; None: no transaction was open (it was
        completed before the manager crashed)."""
        tm = self._tm()
        outcome: list[bool | None] = []

        def start() -> TxnResult:
            commit, result = tm.complete_transaction(state)
            outcome.append(commit)
            return result
        await self._txn_call("complete_transaction", start, self._txn_timeout(timeout))
        return outcome[0] if outcome else tm._completing

    def resume_transaction(self, producer_id: int, producer_epoch: int) -> None:
        """Only to commit or abort a transaction another producer of this transactional.id
        opened and left open (TransactionManager.resume_transaction): instead of
        init_transactions, on a new producer."""
        tm = self._tm()
        with self.lock:
            tm.resume_transaction(producer_id, producer_epoch)

    @property
    def transaction_ids(self) -> tuple[int, int]:
        """(producer id, epoch) of the transactional producer after init_transactions: what
        another process needs to resume its open transaction."""
        tm = self._tm()
        with self.lock:
            return tm.producer_id, tm.producer_epoch

    def begin_transaction(self) -> None:
        tm = self._tm()
        with self.lock:
            tm.begin_transaction()
        self._txn_calls.clear()   # an earlier call's outcome answers no later call

    async def send_offsets_to_transaction(self, offsets, group_metadata: ConsumerGroupMetadata,
                                          timeout: float | None = None) -> None:
        """Commit consumer positions (`{TopicPartition: offset or OffsetAndMetadata}`, or a
        list of TopicPartitions whose `offset` is set, as confluent-kafka's) with the
        transaction; `group_metadata` from `Consumer.consumer_group_metadata()` or built by the
        caller."""
        tm = self._tm()
        if not isinstance(offsets, dict):
            offsets = {TopicPartition(tp.topic, tp.partition): tp.offset for tp in offsets}
        if isinstance(group_metadata, str):
            group_metadata = ConsumerGroupMetadata(group_metadata)
        positions = offsets
        await self._txn_call("send_offsets_to_transaction",
                             lambda: tm.send_offsets_to_transaction(positions, group_metadata),
                             self._txn_timeout(timeout))

    async def commit_transaction(self, timeout: float | None = None) -> None:
        """Send what is queued, then commit. A TransactionAbortableError means the
        transaction must be aborted; a TransactionTimeoutError that the same call may be made
        again (it resumes, never commits twice or differently)."""
        tm = self._tm()
        await self._txn_call("commit_transaction", tm.commit_transaction, self._txn_timeout(timeout))

    async def abort_transaction(self, timeout: float | None = None) -> None:
        """Drop what was not sent, wait for what was, then abort."""
        tm = self._tm()
        await self._txn_call("abort_transaction", tm.abort_transaction, self._txn_timeout(timeout))

    def _txn_timeout(self, timeout: float | None) -> float:
        if timeout is None and self.config.two_phase_commit:
            return self.config.max_block_ms / 1000   # no transaction timeout to go by
        return self.config.transaction_timeout_ms / 1000 if timeout is None else timeout

    async def _txn_call(self, operation: str, start: Callable[[], TxnResult], timeout: float) -> None:
        assert self.loop is not None, "start() the producer first"
        earlier = self._txn_calls.pop(operation, None)
        if earlier is not None and earlier.done:
            # the call the caller gave up on has completed since: that is this call's outcome
            self._txn_calls.clear()
            if earlier.error is not None:
                raise earlier.error
            return
        self.handoff.take(now_ms())   # records sent before this call belong to the transaction
        with self.lock:
            result = start()
            done = self.core.take_completions()
        self.delivery.deliver(done)
        self.wakeup.set()
        fut = self.loop.create_future()
        result.add_done_callback(lambda _r: _settle(fut))
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            self._txn_calls[operation] = result
            raise TransactionTimeoutError(
                f"{operation} did not complete within {timeout:.3g}s; call it again to resume"
            ) from None
        self._txn_calls.clear()
        if result.error is not None:
            raise result.error

    # ------------------------------------------------------------------ introspection

    @property
    def requests_sent(self) -> int:
        return self.sender.requests_sent

    @property
    def is_ours(self) -> bool:
        """The broker speaks Produce v14 (KIP-1269's field)."""
        return self.metadata.is_ours

    def partition_window(self, topic: str, partition: int) -> int:
        with self.lock:
            return self.core.partition_state(TopicPartition(topic, partition)).window

    def max_in_flight_seen(self, topic: str, partition: int) -> int:
        with self.lock:
            return self.core.partition_state(TopicPartition(topic, partition)).max_in_flight_seen

    @property
    def stats(self) -> dict[str, int]:
        """Recovery counters: retries, epoch_bumps, sequence_resets, duplicates, given_up,
        resolved."""
        return dict(self.core.stats)

    @property
    def fatal_error(self) -> BaseException | None:
        """The error that stopped the producer (fenced, data loss detected), if one did."""
        return self.core.fatal

    @property
    def idempotent(self) -> bool:
        return self.core.idempotent

    @property
    def idempotence_mode(self) -> Idempotence:
        return self.config.idempotence
