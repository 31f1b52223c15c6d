"""The asyncio producer: moves bytes for `ProducerCore`, which makes every decision.

Records sent from other threads (the synchronous facade) are handed to the loop thread through a
flat list, without a lock and without a hop through the event loop per record; the loop takes
them a partition run at a time and is only woken when a batch's worth is waiting. The core is
guarded by a threading lock for the few calls that come from other threads."""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from functools import partial
from itertools import compress, repeat
from operator import attrgetter, is_not
from threading import get_ident
from typing import Any, Callable, NamedTuple

from oncelog.client.accumulator import TopicPartition
from oncelog.client.aio.cluster import Cluster
from oncelog.client.aio.connection import BrokerConnectionError
from oncelog.client.config import Idempotence, ProducerConfig
from oncelog.client.errors import (
    BufferExhaustedError, ConfigError, KafkaClientError, ProducerClosedError, RecordTooLargeError)
from oncelog.client.futures import RecordFuture, complete_all
from oncelog.client.partitioner import StickyPartitioner
from oncelog.client.producer_core import PartitionResult, ProducerCore
from oncelog.protocol import init_producer_id, metadata, produce
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, error_code
from oncelog.protocol.records import (BATCH_OVERHEAD, RECORD_OVERHEAD, message_format_magic,
                                      record_size_upper_bound)

log = logging.getLogger("oncelog.client.producer")

_RETRIABLE_PID = {ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                  ErrorCode.NOT_COORDINATOR, ErrorCode.CONCURRENT_TRANSACTIONS,
                  ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NETWORK_EXCEPTION}
_BUMP_REFUSED = {ErrorCode.INVALID_PRODUCER_ID_MAPPING, ErrorCode.INVALID_PRODUCER_EPOCH,
                 ErrorCode.PRODUCER_FENCED, ErrorCode.UNSUPPORTED_VERSION, ErrorCode.INVALID_REQUEST}


class RecordMetadata(NamedTuple):
    topic: str
    partition: int
    offset: int | None   # None after DUPLICATE_SEQUENCE_NUMBER: delivered, offset unknown
    timestamp: int


class BatchMetadata(NamedTuple):
    """The result of `send_encoded`: where a caller-encoded batch landed."""
    topic: str
    partition: int
    base_offset: int | None   # None after DUPLICATE_SEQUENCE_NUMBER
    count: int
    timestamp: int            # the batch's max timestamp, or the broker's LogAppendTime


_new_metadata = partial(tuple.__new__, RecordMetadata)
_on_delivery_of = attrgetter("_on_delivery")
HANDOFF_FIELDS = 7   # tp, timestamp, key, value, headers, cookie, size
_ENCODED = object()   # marks a send_encoded batch in the handoff (its "key")


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class _FlushWaiter(NamedTuple):
    batches: set        # the batches still to complete of those incomplete when flush began
    done: asyncio.Future


class DeliveryCallback:
    """The cookie of a record sent without a future (`Producer.produce`)."""
    __slots__ = ("_on_delivery",)

    def __init__(self, on_delivery: Callable | None) -> None:
        self._on_delivery = on_delivery


# A record's cookie says how its outcome is reported: a RecordFuture (the sync facade's send;
# its callback, if any, in `_on_delivery`), a DeliveryCallback (produce: callback only), or an
# (asyncio future, callback) pair (AIOProducer.send). One object per record, none per field:
# the collector tracks every object that lives until delivery.
def resolve(cookie, meta, err) -> None:
    """Report one record's outcome (batches of one cookie kind are reported in bulk)."""
    if cookie.__class__ is tuple:
        fut, cb = cookie
    else:
        fut = cookie if cookie.__class__ is RecordFuture else None
        cb = cookie._on_delivery
    if fut is not None and not fut.done():
        if err is None:
            fut.set_result(meta)
        else:
            fut.set_exception(err)
    if cb is not None:
        _report(cb, err, meta)


def call_back(callbacks: list, metas: list, err) -> None:
    """Run a batch's delivery callbacks; one that raises is logged and the rest still run."""
    cb = callbacks[0]
    if callbacks.count(cb) == len(callbacks):
        if cb is None:
            return
        # one callback for the whole batch (the usual case): called from C, no loop in Python
        it = iter(metas)
        while True:
            try:
                deque(map(cb, repeat(err), it), maxlen=0)
                return
            except Exception:  # noqa: BLE001 - a user callback must not kill the sender
                log.exception("on_delivery callback raised")
    for cb, meta in zip(callbacks, metas):
        if cb is not None:
            _report(cb, err, meta)


def _report(cb: Callable, err, meta) -> None:
    try:
        cb(err, meta)
    except Exception:  # noqa: BLE001 - a user callback must not kill the sender
        log.exception("on_delivery callback raised")


def _flag(config: dict, name: str, default: bool) -> bool:
    v = config.get(name, default)
    if isinstance(v, bool):
        return v
    if str(v).strip().lower() in ("true", "false"):
        return str(v).strip().lower() == "true"
    raise ConfigError(f"{name} must be true or false, got {v!r}")


def now_ms() -> int:
    return int(time.monotonic() * 1000)


def _bytes(v) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"key/value must be bytes, str or None, not {type(v).__name__}")


class AIOProducer:
    """`await AIOProducer(config).start()`, then `await send(...)` -> asyncio future of
    RecordMetadata; `flush()`, `close()`."""

    def __init__(self, config: dict) -> None:
        self.raw_config = dict(config)
        self.config = ProducerConfig.from_dict(config)
        self.core = ProducerCore(self.config)
        self.lock = threading.Lock()
        self.cluster = Cluster(self.config.bootstrap_servers, self.config.client_id,
                               self.config.request_timeout_ms,
                               allow_auto_create=str(config.get("allow.auto.create.topics", "true")).lower() != "false",
                               address_map=config.get("oncelog.address.map"))
        self.cluster.listeners.append(self._on_metadata)
        self.cluster.on_connect.append(self._on_connected)
        self.partitioner = StickyPartitioner(
            self.config.batch_size, ignore_keys=_flag(config, "partitioner.ignore.keys", False),
            load=self._partition_load if _flag(
                config, "partitioner.adaptive.partitioning.enable", True) else None)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Future | None = None
        self._wake_pending = False
        self._sender: asyncio.Task | None = None
        self._ready_topics: dict[str, int] = {}   # topic -> partition count, format checked
        self._topic_tasks: dict[str, asyncio.Task] = {}
        self._pid_task: asyncio.Task | None = None
        self._pid_retry_at = 0
        self._mem_cond = threading.Condition(self.lock)
        self._mem_waiters = 0
        self._async_mem: list[asyncio.Future] = []
        self._flushes: list[_FlushWaiter] = []
        # requests on the wire -> their batches: what flush waits for and close fails
        self._closing = False
        self._closed = False
        self._close_task: asyncio.Future | None = None
        self._loop_ident = -1
        self.requests_sent = 0
        self.is_ours = False           # the broker speaks Produce v14 (KIP-1269 field)
        self._tps: dict[str, list[TopicPartition]] = {}
        self._batch_size = self.config.batch_size
        self._buffer_memory = self.config.buffer_memory
        self._linger_ms = self.config.linger_ms
        self._max_record_size = self.config.max_request_size - BATCH_OVERHEAD
        # Records sent from other threads (the sync facade) wait here for the loop thread,
        # which alone appends them to the accumulator: a sender never contends with the sender
        # loop for a lock (with the GIL, that contention made each side wait for the other).
        self._handoff: list = []
        self._handoff_added = 0      # bytes; written by sending threads only
        self._handoff_taken = 0      # bytes; written by the loop thread only
        self._wake_at_ms = 0         # when the sleeping loop will look at the handoff anyway

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> "AIOProducer":
        self.loop = asyncio.get_running_loop()
        self._loop_ident = threading.get_ident()
        conn = await self.cluster.any_connection()
        await self.cluster.refresh([])
        pv = conn.version(ApiKey.PRODUCE)
        self.is_ours = pv is not None and pv >= 14
        if pv is None:
            raise KafkaClientError(f"broker {conn.addr} cannot take Produce v3+ (record batch v2)")
        with self.lock:
            if ApiKey.INIT_PRODUCER_ID not in conn.versions:
                self.core.broker_lacks_idempotence("no InitProducerId in ApiVersions")
        if self.core.fatal is not None:
            raise self.core.fatal
        self._sender = asyncio.ensure_future(self._run())
        if self.core.idempotent:
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

    async def __aenter__(self) -> "AIOProducer":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def flush(self, timeout: float | None = None) -> None:
        """Return once every record sent before the call is complete — its future done and its
        callback run, delivered or failed (Java's flush). Records sent meanwhile are not waited
        for. While any flush waits, batches go out without lingering. asyncio.TimeoutError if
        `timeout` (seconds) passes first."""
        self._take_handoff(now_ms())   # records other threads sent before this call
        with self.lock:
            done = self.core.take_completions()
            waiter = _FlushWaiter(self._incomplete_batches(), self.loop.create_future())
            self.core.acc.flushing += 1
        try:
            self._deliver(done)
            if not waiter.batches:
                return
            self._flushes.append(waiter)
            self.wakeup()
            try:
                await asyncio.wait_for(waiter.done, timeout)
            except asyncio.TimeoutError:
                raise asyncio.TimeoutError(
                    f"flush timed out after {timeout}s: {sum(b.count for b in waiter.batches)} "
                    f"records sent before it are not complete") from None
            finally:
                self._flushes.remove(waiter)
        finally:
            with self.lock:
                self.core.acc.flushing -= 1

    def _incomplete_batches(self) -> set:
        """Every batch not yet completed: queued, or in a request on the wire (caller holds the
        lock; completed batches not yet delivered were taken from the core just before)."""
        pending = {b for q in self.core.acc.queues.values() for b in q}
        pending.update(b for b in self.core.on_wire if not b.done)
        return pending

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
            if self._sender is not None:
                # also after a fatal error: batches on the wire are still answered (Java waits too)
                await self.flush(timeout)
        except asyncio.TimeoutError:
            log.warning("close: records not delivered within %.1fs are failed", timeout)
        finally:
            self._closed = True
            self._take_handoff(now_ms())
            with self.lock:
                self.core.fail_all(
                    ProducerClosedError("producer closed before delivery"),
                    ProducerClosedError("producer closed while the records' outcome was unknown: "
                                        "they may or may not have been written"))
                done = self.core.take_completions()
            self._deliver(done)
            if self._sender is not None:
                self._sender.cancel()
                try:
                    await self._sender
                except (asyncio.CancelledError, Exception):  # noqa: BLE001
                    pass
            for t in list(self._topic_tasks.values()) + ([self._pid_task] if self._pid_task else []):
                t.cancel()
            self.cluster.close()

    # ------------------------------------------------------------------ sending

    async def send(self, topic: str, value=None, key=None, headers=None, partition: int | None = None,
                   timestamp: int | None = None, on_delivery: Callable | None = None) -> asyncio.Future:
        """Queue a record; returns a future of its RecordMetadata."""
        fut = self.loop.create_future()
        while True:
            r = self.append(topic, value, key, headers, partition, timestamp, (fut, on_delivery))
            if r:
                return fut
            if r is None:
                await self.ensure_topic(topic)
                continue
            w = self.loop.create_future()
            self._async_mem.append(w)
            try:
                await asyncio.wait_for(w, self.config.max_block_ms / 1000)
            except asyncio.TimeoutError:
                raise BufferExhaustedError(
                    f"buffer.memory={self.config.buffer_memory} full for max.block.ms="
                    f"{self.config.max_block_ms}") from None

    async def send_and_wait(self, topic: str, value=None, key=None, **kw) -> RecordMetadata:
        return await (await self.send(topic, value, key, **kw))

    def append(self, topic: str, value, key, headers, partition, timestamp, cookie: Any
               ) -> bool | None:
        """Thread-safe: add a record. False when buffer.memory is full, None when the topic's
        metadata is not loaded yet (`ensure_topic`); nothing was added in either case."""
        n = self._ready_topics.get(topic)
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
        tp = tps[partition] if tps is not None and partition < len(tps) else self._tp(topic, partition)
        if get_ident() == self._loop_ident:
            return self._append_on_loop(tp, ts, key, value, headers, cookie, n)
        return self._hand_over(tp, ts, key, value, headers, cookie, size)

    def _append_on_loop(self, tp: TopicPartition, ts: int, key, value, headers, cookie, n: int) -> bool:
        now = now_ms()
        if self._handoff:
            # records other threads handed over before this one go first: a caller that sent
            # from a thread and then from the loop (or waited on one) sees its order kept
            self._take_handoff(now)
        with self.lock:
            r = self.core.append(tp, ts, key, value, headers, cookie, now)
            if r is None:
                return False
            batch, new = r
            full = batch.size >= self._batch_size
        if (new or full) and not self._wake_pending:
            self.wakeup()
        return True

    def _partition_load(self, topic: str, n: int) -> tuple[list[int], list[int]]:
        """Batches queued per partition that has a leader, for adaptive partitioning (read
        without the lock from a sending thread: a slightly stale count only skews a draw)."""
        tps = self._tps.get(topic) or ()
        queues = self.core.acc.queues
        states = self.core.partitions
        queued, ids = [], []
        for p in range(n):
            tp = tps[p] if p < len(tps) else TopicPartition(topic, p)
            ps = states.get(tp)
            if ps is not None and ps.leader < 0:
                continue
            q = queues.get(tp)
            queued.append(len(q) if q else 0)
            ids.append(p)
        return queued, ids

    def _tp(self, topic: str, partition: int) -> TopicPartition:
        """One TopicPartition object per partition (compared by identity in the handoff)."""
        tps = self._tps.get(topic)
        if tps is None or len(tps) <= partition:
            old = tps or []   # a new list, swapped in whole: senders may race here
            tps = self._tps[topic] = old + [TopicPartition(topic, i)
                                            for i in range(len(old), partition + 1)]
        return tps[partition]

    def _hand_over(self, tp: TopicPartition, ts: int, key, value, headers, cookie, size: int) -> bool:
        """From a thread other than the loop's: queue for the loop thread, which alone appends
        to the accumulator, so that a sender never contends with the sender loop for a lock."""
        core = self.core
        if core.fatal or core.topic_errors:
            core.check_accepting(tp)
        waiting = self._handoff_added - self._handoff_taken
        used = core.acc.used_bytes + (waiting if waiting > 0 else 0)
        if used + size > self._buffer_memory and used > 0:
            return False
        self._handoff.extend((tp, ts, key, value, headers, cookie, size))
        self._handoff_added += size
        if self._closed:   # close() took the handoff before this record arrived
            self._fail_late_handoff()
            return True
        # wake the loop if this fills a batch, or if it sleeps past this record's linger
        # (_wake_at_ms is 0 while it runs: it takes the handoff before it sleeps again)
        if not self._wake_pending and (
                waiting + size >= self._batch_size
                or self._wake_at_ms and self._wake_at_ms > time.monotonic() * 1000 + self._linger_ms):
            self.wakeup_threadsafe()
        return True

    def _fail_late_handoff(self) -> None:
        """A sender that passed the closing check just before close() began, and handed its
        record over after close() took the handoff: nobody else will, so fail what is there."""
        with self.lock:
            items = self._pop_handoff()
        err = ProducerClosedError("producer closed before delivery")
        for cookie in items[5::HANDOFF_FIELDS]:   # the cookies
            resolve(cookie, None, err)

    def _pop_handoff(self) -> list:
        """Everything handed over so far (under the lock, so that one taker gets each record).
        Senders only add at the end and never lock: the items are copied, then deleted, in two
        C-level steps."""
        h = self._handoff
        items = h[:]
        del h[:len(items)]
        return items

    def _take_handoff(self, now: int) -> None:
        """Loop thread: move handed-over records into the accumulator, in order.

        The handoff is a flat list: each record is HANDOFF_FIELDS consecutive items, added by
        one `list.extend` (atomic under the GIL; no tuple per record lives on for the collector
        to track); columns are cut out by slicing."""
        h = self._handoff
        if not h:
            return
        failed: list = []
        with self.lock:
            items = self._pop_handoff()
            cols = [items[i::HANDOFF_FIELDS] for i in range(HANDOFF_FIELDS)]
            tps = cols[0]
            m = len(tps)
            if tps.count(tps[0]) == m:
                runs = [(0, m)]
            else:   # consecutive records of one partition are appended as one run
                cuts = [0, *compress(range(1, m), map(is_not, tps[1:], tps[:-1])), m]
                runs = list(zip(cuts, cuts[1:]))
            for i, j in runs:
                run = [c[i:j] for c in cols]
                if _ENCODED in run[2]:   # caller-encoded batches are queued one by one
                    for one in range(j - i):
                        self._append_run([c[one:one + 1] for c in run], now, failed)
                else:
                    self._append_run(run, now, failed)
            self._handoff_taken += sum(cols[6])
            if not h:   # resynchronise: a sender's lost update (two threads) cannot drift
                self._handoff_taken = self._handoff_added
        for cookie, e in failed:
            resolve(cookie, None, e)

    def _append_run(self, cols: list, now: int, failed: list) -> None:
        """Records of one partition as columns (tp, ts, key, value, headers, cookie, size)."""
        tps, tss, keys, values, headers, cookies, sizes = cols
        tp = tps[0]
        core = self.core
        # the producer may have gone fatal, or the topic failed, since they were admitted
        e = core.fatal or core.topic_errors.get(tp.topic)
        if e is not None:
            failed.extend(zip(cookies, repeat(e)))
        elif keys[0] is _ENCODED:
            core.acc.append_encoded(tp, *values[0], cookies[0], now, admitted=True)
        else:
            core.acc.extend(tp, tss, keys, values, headers, cookies, sizes, now)

    def append_encoded(self, topic: str, partition: int, records, count: int, base_ts: int,
                       max_ts: int, cookie: Any) -> bool:
        """Thread-safe batch-level append (see Producer.send_encoded); False when buffer.memory
        is full."""
        if self._closing:
            raise ProducerClosedError("producer is closed")
        n = self._ready_topics[topic]
        if not 0 <= partition < n:
            raise KafkaClientError(f"topic {topic} has {n} partitions, no partition {partition}")
        if count <= 0:
            raise ValueError("a batch holds at least one record")
        if len(records) + BATCH_OVERHEAD > self.config.max_request_size:
            raise RecordTooLargeError(
                f"batch of {len(records) + BATCH_OVERHEAD} bytes exceeds max.request.size="
                f"{self.config.max_request_size}")
        tp = self._tp(topic, partition)
        size = BATCH_OVERHEAD + len(records)
        if get_ident() != self._loop_ident:
            # through the handoff like `send`, so that both keep one order per thread
            return self._hand_over(tp, 0, _ENCODED, (records, count, base_ts, max_ts), None,
                                   cookie, size)
        now = now_ms()
        if self._handoff:
            self._take_handoff(now)   # as in _append_on_loop: earlier records first
        with self.lock:
            if self.core.append_encoded(tp, records, count, base_ts, max_ts, cookie, now) is None:
                return False
        if not self._wake_pending:
            self.wakeup()
        return True

    def wakeup(self) -> None:
        self._wake_pending = True
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def wakeup_threadsafe(self) -> None:
        self._wake_pending = True
        self.loop.call_soon_threadsafe(self.wakeup)

    async def ensure_topic(self, topic: str) -> int:
        """Load a topic's metadata and message format once; returns its partition count."""
        n = self._ready_topics.get(topic)
        if n is not None:
            return n
        t = self._topic_tasks.get(topic)
        if t is None or t.done() and t.exception() is not None:
            t = self._topic_tasks[topic] = asyncio.ensure_future(self._load_topic(topic))
        return await asyncio.shield(t)

    async def _load_topic(self, topic: str) -> int:
        info = await self.cluster.topic(topic, self.config.max_block_ms / 1000)
        if self.core.idempotent:
            magic = await self._topic_magic(info)
            with self.lock:
                self.core.topic_message_format(topic, magic >= 2, f"v{magic}")
        with self.lock:
            self._on_metadata_topic(info)
        self._ready_topics[topic] = len(info.partitions)
        return len(info.partitions)

    async def _topic_magic(self, info: metadata.TopicEntry) -> int:
        if info.message_format_magic is not None:
            return info.message_format_magic
        if self.is_ours:
            return 2   # our broker sends tag 10000 whenever the format is below v2
        if self.cluster.version(ApiKey.DESCRIBE_CONFIGS) is None:
            return 2
        from oncelog.client.aio.admin import describe_topic_config
        try:
            cfg = await describe_topic_config(self.cluster, info.name, ["message.format.version"])
        except Exception as e:  # noqa: BLE001 - no rights / not supported: assume a modern format
            log.debug("DescribeConfigs for %s failed (%r): assuming message format v2", info.name, e)
            return 2
        return message_format_magic(cfg.get("message.format.version"))

    def _on_metadata(self, info: metadata.MetadataResponse) -> None:
        with self.lock:
            for t in info.topics.values():
                if t.error_code == 0:
                    self._on_metadata_topic(t)
        self.wakeup()

    def _on_connected(self, node: int) -> None:
        with self.lock:
            self.core.on_connected(node)   # KIP-1269: this node's partitions start at 5 again

    def _on_metadata_topic(self, t: metadata.TopicEntry) -> None:
        for p in t.partitions:
            self.core.update_leader(TopicPartition(t.name, p.index), p.leader_id, p.leader_epoch)
        if t.name in self._ready_topics:
            self._ready_topics[t.name] = len(t.partitions)

    # ------------------------------------------------------------------ sender loop

    async def _run(self) -> None:
        loop = self.loop
        try:
            while True:
                fut = self._wake = loop.create_future()
                self._wake_pending = False
                timeout = self._step()
                if fut.done() or timeout == 0:
                    continue
                self._wake_at_ms = float("inf") if timeout is None else now_ms() + timeout
                if self._handoff and (timeout is None or timeout > self._linger_ms):
                    # handed over after _step took the handoff and before _wake_at_ms was set:
                    # that sender saw the loop running and did not wake it
                    self._wake_at_ms = 0
                    await asyncio.sleep(0)   # let responses in before the next pass
                    continue
                h = None if timeout is None else loop.call_later(timeout / 1000, _wake, fut)
                await fut
                self._wake_at_ms = 0
                if h is not None:
                    h.cancel()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001
            log.exception("producer sender loop crashed")
            with self.lock:
                self.core._go_fatal(KafkaClientError("producer sender loop crashed; see the log"))
                done = self.core.take_completions()
            self._deliver(done)

    def _step(self) -> int | None:
        """One pass of the sender: returns ms to sleep (None = until woken)."""
        now = now_ms()
        sleep: int | None = 100
        if self._handoff:
            self._take_handoff(now)
        with self.lock:
            core = self.core
            req = core.producer_id_request() if now >= self._pid_retry_at else None
            if req is not None:
                self._pid_task = asyncio.ensure_future(self._init_pid(*req))
            elif core.idempotent and core.producer_id < 0 and not core.init_pid_in_progress:
                sleep = max(1, self._pid_retry_at - now)
            core.expire(now)
            nodes, next_ms, unknown = core.ready(now)
            stale = time.monotonic() - self.cluster.last_refresh > self.config.metadata_max_age_ms / 1000
            if unknown or core.metadata_refresh_needed or stale:
                core.metadata_refresh_needed = False
                self.cluster.request_refresh()
            for node in nodes:
                conn = self.cluster.ready_connection(node)
                if conn is None:
                    if node in self.cluster.brokers:
                        self.cluster.start_connect(node)
                        t = self.cluster._connecting.get(node)
                        if t is not None:
                            t.add_done_callback(lambda _f: self.wakeup())
                    else:
                        self.cluster.request_refresh()
                    continue
                while core.can_send_to(node):
                    batches = core.drain(node, now)
                    if not batches:
                        break
                    self._send_produce(conn, node, batches, now)
            if next_ms is not None:
                sleep = max(0, min(sleep, next_ms - now)) if sleep is not None else max(0, next_ms - now)
            done = core.take_completions()
        self._deliver(done)
        return sleep

    def _send_produce(self, conn, node: int, batches: list, now: int) -> None:
        version = conn.version(ApiKey.PRODUCE)
        ids = self.cluster.topic_ids
        if version >= 13 and any(b.tp.topic not in ids for b in batches):
            version = 12
        topics: dict[Any, list] = {}
        for b in batches:
            key = ids[b.tp.topic] if version >= 13 else b.tp.topic
            topics.setdefault(key, []).append((b.tp.partition, b.encoded))
        body = produce.encode_request_parts(version, self.config.acks, self.config.request_timeout_ms, topics)
        acks0 = self.config.acks == 0
        try:
            fut = conn.send(ApiKey.PRODUCE, version, body, expect_response=not acks0)
        except BrokerConnectionError as e:
            if not acks0:
                self.core.on_request_failed(node, batches, now, str(e))
            return
        self.requests_sent += 1
        if fut is None:
            return
        timer = self.loop.call_later(self.config.request_timeout_ms / 1000, self._request_timed_out,
                                     conn, fut)
        fut.add_done_callback(lambda f: self._on_produce_done(node, version, batches, f, timer))

    def _request_timed_out(self, conn, fut) -> None:
        if not fut.done():
            # Kafka closes the connection on a request timeout: every in-flight request on it
            # then fails and is retried under its sequence
            conn._fail(BrokerConnectionError(
                f"request to {conn.addr} timed out after request.timeout.ms="
                f"{self.config.request_timeout_ms}"))

    def _on_produce_done(self, node: int, version: int, batches: list, fut: asyncio.Future, timer) -> None:
        timer.cancel()
        now = now_ms()
        try:
            body = fut.result()
            topics = produce.decode_response(version, body)
        except BaseException as e:  # noqa: BLE001 - connection lost or garbage: outcome unknown
            with self.lock:
                self.core.on_request_failed(node, batches, now, str(e))
            self._completed()
            return
        results: dict[tuple, PartitionResult] = {}
        names = self.cluster.topic_names
        for t in topics:
            name = names.get(t.topic, t.topic) if version >= 13 else t.topic
            for p in t.partitions:
                results[(name, p.index)] = PartitionResult(
                    p.error_code, p.base_offset, p.log_append_time, p.log_start_offset,
                    p.error_message, p.reported_batches_to_retain, t.max_in_flight_sequence_number)
                if p.leader_id >= 0:   # KIP-951 CurrentLeader, with NOT_LEADER_OR_FOLLOWER
                    results[(name, p.index)].current_leader = (p.leader_id, p.leader_epoch)
        missing = PartitionResult(error_code=ErrorCode.NETWORK_EXCEPTION,
                                  error_message="partition missing from the Produce response")
        pairs = [(b, results.get(b.tp, missing)) for b in batches]
        with self.lock:
            self.core.on_response(node, pairs, now)
        self._completed()

    def _completed(self) -> None:
        """After an answer: the sender loop's next pass sends what may now go, then delivers
        (the broker works on the next request while callbacks run). Without a running loop
        (closing, or it crashed) the outcomes are delivered here, so that none waits forever."""
        if self._sender is not None and not self._sender.done():
            self.wakeup()
            return
        with self.lock:
            done = self.core.take_completions()
        self._deliver(done)

    async def _init_pid(self, pid: int, epoch: int) -> None:
        try:
            await self._init_pid_once(pid, epoch)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - e.g. a garbled answer: never leave it in progress
            log.exception("InitProducerId handling failed; retrying")
            with self.lock:
                self.core.on_producer_id_failed(e)
                self._pid_retry_at = now_ms() + self.config.retry_backoff_ms
            self.wakeup()

    async def _init_pid_once(self, pid: int, epoch: int) -> None:
        try:
            conn = await self.cluster.any_connection()
            v = conn.version(ApiKey.INIT_PRODUCER_ID)
            if v is None:
                with self.lock:
                    self.core.on_producer_id_failed(KafkaClientError("no InitProducerId"))
                    self.core.broker_lacks_idempotence("no InitProducerId in ApiVersions")
                return
            if pid >= 0 and v < 3:
                pid, epoch = -1, -1   # no KIP-360 bump on this broker: take a fresh id
            err, new_pid, new_epoch = await self._init_pid_request(conn, v, pid, epoch)
            if err and pid >= 0 and err in _BUMP_REFUSED:
                log.warning("InitProducerId bump refused (%s): taking a fresh producer id",
                            error_code(err).name)
                err, new_pid, new_epoch = await self._init_pid_request(conn, v, -1, -1)
        except (BrokerConnectionError, asyncio.TimeoutError, OSError) as e:
            log.info("InitProducerId failed (%r); retrying", e)
            with self.lock:
                self.core.on_producer_id_failed(e)
                self._pid_retry_at = now_ms() + self.config.retry_backoff_ms
            self.wakeup()
            return
        with self.lock:
            if err == 0:
                self.core.on_producer_id(new_pid, new_epoch)
            elif err in _RETRIABLE_PID:
                self.core.on_producer_id_failed(KafkaClientError(error_code(err).name))
                self._pid_retry_at = now_ms() + self.config.retry_backoff_ms
            elif pid < 0 and self.core.producer_id < 0:
                self.core.on_producer_id_failed(KafkaClientError(error_code(err).name))
                self.core.broker_lacks_idempotence(f"InitProducerId failed with {error_code(err).name}")
            else:
                self.core.on_producer_id_failed(
                    KafkaClientError(f"InitProducerId failed: {error_code(err).name}"), fatal=True)
            done = self.core.take_completions()
        self._deliver(done)
        self.wakeup()

    async def _init_pid_request(self, conn, v: int, pid: int, epoch: int) -> tuple[int, int, int]:
        body = await asyncio.wait_for(
            conn.request(ApiKey.INIT_PRODUCER_ID, v, init_producer_id.encode_request(v, pid, epoch)),
            self.config.request_timeout_ms / 1000)
        return init_producer_id.decode_response(v, body)

    # ------------------------------------------------------------------ completions

    def _deliver(self, completions: list) -> None:
        if not completions:
            return
        for c in completions:
            b = c.batch
            topic, partition = b.tp
            err = c.error
            base = c.base_offset
            lat = c.log_append_time
            cookies = b.cookies
            if b.whole:
                metas = [None if err is not None else BatchMetadata(
                    topic, partition, base, b.count, lat if lat >= 0 else b.max_ts)]
            elif err is None:
                n = len(cookies)
                # built by C-level iteration: a RecordMetadata per record is most of delivery
                metas = list(map(_new_metadata, zip(
                    repeat(topic, n), repeat(partition, n),
                    repeat(None, n) if base is None else range(base, base + n),
                    b.timestamps if lat < 0 else repeat(lat, n))))
            else:
                metas = [None] * len(cookies)
            kind = cookies[0].__class__
            if kind is tuple or list(map(type, cookies)).count(kind) != len(cookies):
                for cookie, meta in zip(cookies, metas):   # asyncio sends, mixed kinds
                    resolve(cookie, meta, err)
                continue
            if kind is RecordFuture:
                complete_all(cookies, metas, err)   # one lock per batch
            call_back(list(map(_on_delivery_of, cookies)), metas, err)
        if self._flushes:
            finished = [c.batch for c in completions]
            for w in self._flushes:
                w.batches.difference_update(finished)
                if not w.batches and not w.done.done():
                    w.done.set_result(None)
        with self.lock:
            if self._mem_waiters:
                self._mem_cond.notify_all()
        for w in self._async_mem:
            if not w.done():
                w.set_result(None)
        self._async_mem.clear()

    # ------------------------------------------------------------------ introspection

    def partition_window(self, topic: str, partition: int) -> int:
        with self.lock:
            return self.core.partition_state(TopicPartition(topic, partition)).window

    def max_in_flight_seen(self, topic: str, partition: int) -> int:
        with self.lock:
            return self.core.partition_state(TopicPartition(topic, partition)).max_in_flight_seen

    @property
    def idempotent(self) -> bool:
        return self.core.idempotent

    @property
    def idempotence_mode(self) -> Idempotence:
        return self.config.idempotence
