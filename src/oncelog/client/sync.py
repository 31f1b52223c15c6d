"""Synchronous facade: each client runs its asyncio counterpart on a private event-loop thread.

Producer.send and Producer.produce hand the record to the loop thread (AIOProducer.append) and
wake it only when a batch's worth is waiting, so a send costs no thread hop per record."""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable

from oncelog.client.aio.admin import NewTopic
from oncelog.client.aio.delivery import DeliveryCallback
from oncelog.client.aio.producer import AIOProducer
from oncelog.client.config import ProducerConfig
from oncelog.client.errors import BufferExhaustedError, KafkaClientError
from oncelog.client.futures import new_record_future
from oncelog.client.partitioner import StickyPartitioner
from oncelog.client.txn_core import PreparedTxnState


async def _end_tasks() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=2)


class LoopThread:
    def __init__(self, name: str) -> None:
        try:
            import uvloop
            self.loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
            self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro, timeout: float | None = None):
        if threading.current_thread() is self.thread:
            coro.close()
            raise KafkaClientError("blocking client call from inside a delivery callback")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        if threading.current_thread() is not self.thread:
            # tasks still pending (a background metadata refresh cancelled by close, a connect)
            # end before the loop stops: else each prints "Task was destroyed but it is pending!"
            # as the process exits
            try:
                asyncio.run_coroutine_threadsafe(_end_tasks(), self.loop).result(3)
            except Exception:  # noqa: BLE001 - a loop that cannot even do that is stopped all the same
                pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            self.loop.close()


class Producer:
    """`Producer({"bootstrap.servers": ...})`; `send()` returns a concurrent.futures.Future of
    RecordMetadata (offset None after DUPLICATE_SEQUENCE_NUMBER)."""

    def __init__(self, config: dict) -> None:
        self._lt = LoopThread("oncelog-producer")
        self._p = AIOProducer(config)
        try:
            self._lt.run(self._p.start(), self._p.config.max_block_ms / 1000)
        except BaseException:
            try:
                self._lt.run(self._p.close(0), 5)
            finally:
                self._lt.stop()
            raise
        self._max_block_s = self._p.config.max_block_ms / 1000
        self._callback_cookies: dict = {}

    @property
    def aio(self) -> AIOProducer:
        return self._p

    @property
    def config(self) -> ProducerConfig:
        return self._p.config

    @property
    def partitioner(self) -> StickyPartitioner:
        """The partitioner `send` uses for records without a partition (KIP-794's sticky one for
        keyless records): columnar writers partition whole runs of rows with it."""
        return self._p.partitioner

    def send(self, topic: str, value=None, key=None, headers=None, partition: int | None = None,
             timestamp: int | None = None, on_delivery: Callable | None = None
             ) -> concurrent.futures.Future:
        fut = new_record_future()
        if on_delivery is not None:
            fut._on_delivery = on_delivery
        if not self._p.append(topic, value, key, headers, partition, timestamp, fut):
            self._append_slowly(topic, value, key, headers, partition, timestamp, fut)
        return fut

    def produce(self, topic: str, value=None, key=None, partition: int | None = None,
                on_delivery: Callable | None = None, timestamp: int | None = None, headers=None,
                *, callback: Callable | None = None) -> None:
        """confluent-kafka's `produce`, with its parameters (partition -1 and timestamp 0 mean
        "choose"): no future, the outcome reaches only `on_delivery(err, metadata)`. The
        cheapest way to send many records: nothing per record outlives the record itself.
        Unlike confluent-kafka it blocks up to max.block.ms when buffer.memory is full, and
        callbacks run on the producer's thread (no poll needed)."""
        cb = on_delivery if on_delivery is not None else callback
        cookie = self._callback_cookies.get(cb)
        if cookie is None:
            cookie = DeliveryCallback(cb)
            if len(self._callback_cookies) < 64:   # callbacks made per record are not kept
                self._callback_cookies[cb] = cookie
        if partition is not None and partition < 0:
            partition = None
        if not self._p.append(topic, value, key, headers, partition, timestamp or None, cookie):
            self._append_slowly(topic, value, key, headers, partition, timestamp or None, cookie)

    def _append_slowly(self, topic, value, key, headers, partition, timestamp, cookie) -> None:
        """The first record of a topic (metadata to load) or a full buffer.memory (wait)."""
        p = self._p
        if p.partition_count(topic) is None:
            self._lt.run(p.ensure_topic(topic), self._max_block_s + 1)
            if p.append(topic, value, key, headers, partition, timestamp, cookie):
                return
        self._wait_for_memory(lambda: p.append(topic, value, key, headers, partition, timestamp, cookie))

    def send_encoded(self, topic: str, partition: int, records, count: int, base_timestamp: int,
                     max_timestamp: int | None = None, on_delivery: Callable | None = None
                     ) -> concurrent.futures.Future:
        """Batch-level send for callers that encode records themselves (columnar writers such
        as the Spark connector): `records` is the records section of a v2 record batch, `count`
        records with offset deltas 0..count-1 and timestamp deltas from `base_timestamp`. It
        travels as one batch with the producer's id, epoch and sequence, retries and dedup like
        any other; the future's result is a SentBatch."""
        p = self._p
        if p.partition_count(topic) is None:
            self._lt.run(p.ensure_topic(topic), self._max_block_s + 1)
        fut = new_record_future()
        if on_delivery is not None:
            fut._on_delivery = on_delivery
        args = (topic, partition, records, count, base_timestamp,
                base_timestamp if max_timestamp is None else max_timestamp, fut)
        if not p.append_encoded(*args):
            self._wait_for_memory(lambda: p.append_encoded(*args))
        return fut

    def _wait_for_memory(self, retry: Callable[[], bool | None]) -> None:
        p = self._p
        if threading.current_thread() is self._lt.thread:
            # inside a delivery callback the loop cannot free memory while we wait
            raise BufferExhaustedError("buffer.memory full while sending from a delivery callback")
        deadline = time.monotonic() + self._max_block_s
        while True:
            p.wait_for_memory(0.05)
            if retry():
                return
            if time.monotonic() >= deadline:
                raise BufferExhaustedError(
                    f"buffer.memory={p.config.buffer_memory} full for max.block.ms="
                    f"{p.config.max_block_ms}")

    def flush(self, timeout: float | None = None) -> None:
        self._lt.run(self._p.flush(timeout), None if timeout is None else timeout + 5)

    # transactions: confluent-kafka's methods and semantics (timeouts in seconds; a call that
    # raised TransactionTimeoutError may be made again and resumes)

    def init_transactions(self, timeout: float | None = None, keep_prepared_txn: bool = False,
                          expected: tuple[int, int] | None = None) -> None:
        """`keep_prepared_txn` (KIP-939, transaction.two.phase.commit.enable=true): keep the
        transaction a crashed producer prepared, for complete_transaction, instead of aborting it.
        `expected` (producer id, epoch): only if that is the id's current one (or the one just
        before, a retry), else ProducerFencedError (TransactionManager.init_transactions)."""
        self._lt.run(self._p.init_transactions(timeout, keep_prepared_txn, expected), None)

    def prepare_transaction(self, timeout: float | None = None) -> PreparedTxnState:
        """KIP-939's prepareTransaction: flush, leave the transaction open (never aborted by a
        timeout), return its state for the external transaction manager to record."""
        return self._lt.run(self._p.prepare_transaction(timeout), None)

    @property
    def prepared_transaction(self) -> PreparedTxnState | None:
        """The transaction kept by init_transactions(keep_prepared_txn=True) (or prepared)."""
        return self._p.prepared_transaction

    def complete_transaction(self, state: PreparedTxnState | str, timeout: float | None = None) -> bool | None:
        """KIP-939's completeTransaction: commit if `state` (or its str()) names the open
        transaction, abort otherwise (logged). True committed, False aborted, None: none open."""
        if isinstance(state, str):
            state = PreparedTxnState.parse(state)
        return self._lt.run(self._p.complete_transaction(state, timeout), None)

    def begin_transaction(self) -> None:
        self._p.begin_transaction()

    def resume_transaction(self, producer_id: int, producer_epoch: int) -> None:
        """On a new producer instead of init_transactions: take over the open transaction
        that another producer of this transactional.id left at (producer_id, producer_epoch),
        only to end it with commit_transaction / abort_transaction (EndTxn at that epoch, no
        InitProducerId, nothing sent). For a process completing transactions that others
        prepared, such as the Spark sink's driver (Flink's resumeTransaction); see
        TransactionManager.resume_transaction."""
        self._p.resume_transaction(producer_id, producer_epoch)

    @property
    def transaction_ids(self) -> tuple[int, int]:
        """(producer id, epoch) after init_transactions, for resume_transaction elsewhere."""
        return self._p.transaction_ids

    @property
    def transaction_version(self) -> int:
        """The transaction protocol of the current transaction: 2 (Transactions V2, KIP-890
        part 2) or 1; 0 for a producer without a transactional.id."""
        txn = self._p.txn
        return 0 if txn is None else 2 if txn.transaction_v2 else 1

    def send_offsets_to_transaction(self, offsets, group_metadata, timeout: float | None = None
                                    ) -> None:
        self._lt.run(self._p.send_offsets_to_transaction(offsets, group_metadata, timeout), None)

    def commit_transaction(self, timeout: float | None = None) -> None:
        self._lt.run(self._p.commit_transaction(timeout), None)

    def abort_transaction(self, timeout: float | None = None) -> None:
        self._lt.run(self._p.abort_transaction(timeout), None)

    def close(self, timeout: float | None = None) -> None:
        if self._lt.loop.is_closed():
            return
        try:
            self._lt.run(self._p.close(timeout), None if timeout is None else timeout + 5)
        finally:
            self._lt.stop()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def partitions_for(self, topic: str) -> int:
        """The topic's partition count (loads its metadata on first use)."""
        n = self._p.partition_count(topic)
        return n if n is not None else self._lt.run(self._p.ensure_topic(topic), self._max_block_s + 1)

    def partition_window(self, topic: str, partition: int) -> int:
        """The per-partition in-flight limit learned from the leader (KIP-1269)."""
        return self._p.partition_window(topic, partition)

    @property
    def closed(self) -> bool:
        """close() was called (or is under way): nothing more can be sent."""
        return self._p.closed

    @property
    def fatal_error(self) -> BaseException | None:
        """The error that stopped the producer (fenced, data loss detected), if one did: every
        send fails with it from then on."""
        return self._p.fatal_error

    @property
    def idempotent(self) -> bool:
        return self._p.idempotent

    @property
    def stats(self) -> dict[str, int]:
        """Recovery counters: retries, epoch_bumps, sequence_resets, duplicates, given_up,
        resolved."""
        return self._p.stats


class _SyncWrapper:
    """Runs an asyncio client's coroutines on a private loop thread."""

    _name = "oncelog-client"

    def __init__(self, impl) -> None:
        self._lt = LoopThread(self._name)
        self._impl = impl
        try:
            self._lt.run(impl.start(), 60)
        except BaseException:
            self._lt.run(impl.close(), 5)
            self._lt.stop()
            raise

    def _run(self, coro, timeout: float | None = 120):
        return self._lt.run(coro, timeout)

    def close(self) -> None:
        if self._lt.loop.is_closed():
            return
        try:
            self._run(self._impl.close(), 10)
        finally:
            self._lt.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ShareConsumer(_SyncWrapper):
    """A share-group member (KIP-932), as confluent-kafka's ShareConsumer: subscribe, poll (a list
    of ShareRecords, each with its delivery count), acknowledge (explicit mode), commit_sync,
    close (see `aio.share_consumer`)."""

    _name = "oncelog-share-consumer"

    def __init__(self, config: dict) -> None:
        from oncelog.client.aio.share_consumer import AIOShareConsumer
        super().__init__(AIOShareConsumer(config))

    def subscribe(self, topics) -> None:
        self._run(_call(lambda: self._impl.subscribe(list(topics))))

    def poll(self, timeout_s: float = 1.0):
        return self._run(self._impl.poll(timeout_s), timeout_s + 120)

    def acknowledge(self, record, kind: int = 1) -> None:
        self._impl.acknowledge(record, kind)

    def acknowledge_offset(self, topic: str, partition: int, offset: int, kind: int = 1) -> None:
        self._impl.acknowledge_offset(topic, partition, offset, kind)

    def commit_sync(self, timeout: float | None = 60):
        return self._run(self._impl.commit_sync(), timeout)

    def commit_async(self):
        return asyncio.run_coroutine_threadsafe(self._impl.commit_sync(), self._lt.loop)


class Consumer(_SyncWrapper):
    """A consumer: assigned its partitions (assign, seek) or a member of a consumer group
    (subscribe); poll, commit, committed, offsets. Rebalance callbacks run in the thread that
    calls poll, as confluent-kafka's do, so they may call the consumer (commit, seek)."""

    _name = "oncelog-consumer"

    def __init__(self, config: dict) -> None:
        from oncelog.client.aio.consumer import AIOConsumer
        super().__init__(AIOConsumer(config))
        self._on_commit: Callable | None = config.get("on_commit")   # confluent-kafka's: (error, partitions)

    def assign(self, tps) -> None:
        self._impl.assign(tps)

    def subscribe(self, topics, on_assign=None, on_revoke=None, on_lost=None) -> None:
        """Join `group.id` (see AIOConsumer.subscribe); callbacks get (consumer, partitions)."""
        self._callbacks = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost or on_revoke}
        self._run(_call(lambda: self._impl.subscribe(list(topics))))

    def unsubscribe(self) -> None:
        """Leave the group (what poll returned committed with enable.auto.commit, on_revoke run
        here) or drop the assignment; subscribe or assign may follow."""
        leaving = asyncio.run_coroutine_threadsafe(self._impl.unsubscribe(run_callbacks=False), self._lt.loop)
        while not leaving.done():
            self._run_callbacks()
            concurrent.futures.wait([leaving], timeout=0.05)
        leaving.result()
        self._run_callbacks()

    def pause(self, partitions) -> None:
        """Stop fetching these assigned partitions until resume (see AIOConsumer.pause)."""
        self._run(_call(lambda: self._impl.pause(list(partitions))))

    def resume(self, partitions) -> None:
        self._run(_call(lambda: self._impl.resume(list(partitions))))

    def paused(self) -> list:
        return self._run(_call(self._impl.paused))

    def consumer_group_metadata(self):
        """For send_offsets_to_transaction (see AIOConsumer.consumer_group_metadata)."""
        return self._impl.consumer_group_metadata()

    def assignment(self):
        return self._impl.assignment()

    def seek(self, tp, offset: int) -> None:
        self._impl.seek(tp, offset)

    def position(self, tp):
        return self._impl.position(tp)

    def poll(self, timeout_s: float = 1.0, max_records: int | None = None):
        deadline = time.monotonic() + timeout_s
        while True:
            self._run_callbacks()
            left = max(0.0, deadline - time.monotonic())
            records = self._run(self._impl.poll(left, max_records, run_callbacks=False), left + 120)
            if records:
                # callbacks that came due while these were taken wait for the next poll: an
                # on_revoke run now would precede the processing of records of the partitions it
                # gives up (committed there without them, read again by their next owner)
                return records
            if time.monotonic() >= deadline:
                self._run_callbacks()
                return records

    def _run_callbacks(self) -> None:
        while (ev := self._run(_call(self._impl.next_event))) is not None:
            try:
                callback = getattr(self, "_callbacks", {}).get(ev.kind)
                if callback is not None:
                    callback(self, list(ev.partitions))
            finally:
                self._lt.loop.call_soon_threadsafe(self._impl.event_done, ev)

    def commit(self, message=None, offsets=None, asynchronous: bool = True):
        """confluent-kafka's commit: `message` (its offset + 1), `offsets` (TopicPartitions with
        offsets) or every position poll returned; asynchronous by default (the outcome goes to
        the `on_commit` config callback), else waits and returns the partitions committed."""
        if not asynchronous:
            return self._run(self._impl.commit(message, offsets))
        fut = asyncio.run_coroutine_threadsafe(self._impl.commit(message, offsets), self._lt.loop)
        if self._on_commit is not None:
            fut.add_done_callback(self._report_commit)
        return None

    def _report_commit(self, fut) -> None:
        report = self._on_commit
        assert report is not None  # set only with on_commit
        try:
            committed = fut.result()
        except Exception as e:  # noqa: BLE001 - the outcome of an asynchronous commit goes to on_commit
            report(e, [])
            return
        report(None, committed)

    def committed(self, partitions, timeout: float | None = None):
        return self._run(self._impl.committed(partitions, timeout), (timeout or 30) + 30)

    def poll_raw(self, timeout_s: float = 1.0):
        """Whole record batches per partition (see AIOConsumer.poll_raw)."""
        return self._run(self._impl.poll_raw(timeout_s), timeout_s + 120)

    def beginning_offsets(self, tps):
        return self._run(self._impl.beginning_offsets(tps))

    def end_offsets(self, tps):
        return self._run(self._impl.end_offsets(tps))

    def offsets_for_times(self, timestamps: dict):
        return self._run(self._impl.offsets_for_times(timestamps))

    def list_topics(self) -> dict[str, int]:
        return self._run(self._impl.list_topics())

    def close(self) -> None:
        """Commits what poll returned (enable.auto.commit) and leaves the group; rebalance
        callbacks due meanwhile still run here."""
        if self._lt.loop.is_closed():
            return
        closing = asyncio.run_coroutine_threadsafe(self._impl.close(run_callbacks=False), self._lt.loop)
        try:
            end = time.monotonic() + 30
            while not closing.done() and time.monotonic() < end:
                self._run_callbacks()
                concurrent.futures.wait([closing], timeout=0.05)
        finally:
            self._lt.stop()


async def _call(fn):
    return fn()


class AdminClient(_SyncWrapper):
    """create_topics, delete_topics, describe_configs, alter_configs (incremental), list_topics,
    delete_records, describe_producers, list_transactions, and share groups' offsets."""

    _name = "oncelog-admin"

    def __init__(self, config: dict) -> None:
        from oncelog.client.aio.admin import AIOAdminClient
        super().__init__(AIOAdminClient(config))

    def create_topics(self, topics, **kw) -> dict[str, concurrent.futures.Future]:
        """confluent-kafka's create_topics: at once, a future per topic name whose result() is
        None once the topic is created (and in the metadata), or raises its refusal (AdminError,
        e.g. TOPIC_ALREADY_EXISTS unless exist_ok=True). `topics`: names or NewTopics; keywords
        num_partitions, replication_factor, config, timeout_ms, exist_ok for plain names."""
        names = [t.name if isinstance(t, NewTopic) else str(t) for t in topics]
        return self._future_per_topic(names, self._impl.create_topics_each(list(topics), **kw))

    def delete_topics(self, names, **kw) -> dict[str, concurrent.futures.Future]:
        """confluent-kafka's delete_topics: at once, a future per topic whose result() is None
        once the topic is deleted, or raises its refusal (AdminError, e.g.
        UNKNOWN_TOPIC_OR_PARTITION). Keyword: timeout_ms."""
        names = [str(n) for n in names]
        return self._future_per_topic(names, self._impl.delete_topics_each(names, **kw))

    def _future_per_topic(self, names: list[str], request) -> dict[str, concurrent.futures.Future]:
        """A future per name, settled from `request`'s {name: refusal or None}; a request that
        fails as a whole fails every future."""
        futures: dict[str, concurrent.futures.Future] = {n: concurrent.futures.Future() for n in names}
        whole = asyncio.run_coroutine_threadsafe(request, self._lt.loop)

        def settle(done: concurrent.futures.Future) -> None:
            try:
                outcomes = done.result()
            except BaseException as e:  # noqa: BLE001 - the request failed: every topic's future says so
                for f in futures.values():
                    f.set_exception(e)
                return
            for name, f in futures.items():
                error = outcomes.get(name)
                if error is None:
                    f.set_result(None)
                else:
                    f.set_exception(error)
        whole.add_done_callback(settle)
        return futures

    def describe_configs(self, topic: str, keys=None) -> dict:
        return self._run(self._impl.describe_configs(topic, keys))

    def describe_broker_configs(self, node: int | None = None, keys=None) -> dict:
        return self._run(self._impl.describe_broker_configs(node, keys))

    def alter_configs(self, topic: str, configs: dict) -> None:
        self._run(self._impl.alter_configs(topic, configs))

    def list_topics(self) -> dict[str, int]:
        return self._run(self._impl.list_topics())

    def delete_records(self, offsets: dict) -> dict:
        return self._run(self._impl.delete_records(offsets))

    def describe_producers(self, topic: str, partition: int) -> list[dict]:
        return self._run(self._impl.describe_producers(topic, partition))

    def list_transactions(self, states=None, duration_ms: int = -1) -> list[dict]:
        return self._run(self._impl.list_transactions(list(states) if states else None, duration_ms))

    def list_share_group_offsets(self, group: str, partitions=None) -> dict:
        """{TopicPartition: SharePartitionOffset(start_offset, leader_epoch, lag)} of a share
        group (Kafka's Admin.listShareGroupOffsets); `partitions` None: every one it has a state
        for."""
        return self._run(self._impl.list_share_group_offsets(group, None if partitions is None else list(partitions)))

    def alter_share_group_offsets(self, group: str, offsets: dict) -> None:
        """Set the start offsets {TopicPartition: offset} of a share group without members
        (AdminError NON_EMPTY_GROUP otherwise)."""
        self._run(self._impl.alter_share_group_offsets(group, dict(offsets)))

    def delete_share_group_offsets(self, group: str, topics) -> dict:
        """Delete a share group's state of whole topics: {topic: error code} (NONE: deleted)."""
        return self._run(self._impl.delete_share_group_offsets(group, list(topics)))

    def describe_transaction(self, transactional_id: str):
        """DescribeTransactions for one id (a TransactionDescription); AdminError when unknown
        (TRANSACTIONAL_ID_NOT_FOUND) or refused."""
        return self._run(self._impl.describe_transaction(transactional_id))
