"""The sender: the loop-thread task that moves bytes for `ProducerCore`, which decides.

Each pass (`step`) takes what other threads handed over, asks the core for a producer id if one is
due, expires what waited too long, drains the batches the core lets go to each ready broker into
Produce requests and delivers what completed; then it sleeps until woken (`Wakeup`) or until the
core's next deadline. A Produce answer (or its absence: a lost connection, request.timeout.ms) goes
to the core at once and wakes the loop, whose next pass sends what may now go before it runs the
callbacks, so that the broker works on the next request meanwhile. InitProducerId requests run as
their own task; the core says what each answer means."""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from oncelog.client.aio import txn_wire
from oncelog.client.aio.cluster import Cluster
from oncelog.client.aio.connection import BrokerConnectionError, Connection
from oncelog.client.aio.delivery import Delivery
from oncelog.client.config import ProducerConfig
from oncelog.client.errors import KafkaClientError
from oncelog.client.producer_core import PartitionResult, ProducerCore
from oncelog.client.txn_core import FindCoordinatorRequest
from oncelog.core.features import TRANSACTION_VERSION
from oncelog.protocol import init_producer_id, produce
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.metadata import BrokerEntry

if TYPE_CHECKING:
    from oncelog.client.aio.handoff import Handoff

log = logging.getLogger("oncelog.client.producer")


def now_ms() -> int:
    return int(time.monotonic() * 1000)


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class Wakeup:
    """How other code wakes the sender loop. `pending` is set from the first call until the
    loop's next pass begins, so that the many calls in between (a record per call) cost an
    attribute read; `at_ms` is when the sleeping loop will look at the handoff anyway (0 while
    it runs, inf while it sleeps until woken), which lets a sending thread skip waking it."""
    __slots__ = ("pending", "at_ms", "_fut", "_loop")

    def __init__(self) -> None:
        self.pending = False
        self.at_ms: float = 0
        self._fut: asyncio.Future | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def arm(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future:
        """The loop, at the start of a pass: the future the next wake-up completes."""
        self._loop = loop
        fut = self._fut = loop.create_future()
        self.pending = False
        return fut

    def set(self) -> None:
        """On the loop thread."""
        self.pending = True
        if self._fut is not None and not self._fut.done():
            self._fut.set_result(None)

    def set_threadsafe(self) -> None:
        self.pending = True
        self._loop.call_soon_threadsafe(self.set)  # type: ignore[union-attr]  # armed before any send


class Sender:
    def __init__(self, core: ProducerCore, lock: threading.Lock, config: ProducerConfig,
                 cluster: Cluster, delivery: Delivery, wakeup: Wakeup, handoff: Handoff) -> None:
        self.core = core
        self.lock = lock
        self.config = config
        self.cluster = cluster
        self.delivery = delivery
        self.wakeup = wakeup
        self.handoff = handoff
        self.loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._pid_task: asyncio.Task | None = None
        self._txn_task: asyncio.Task | None = None
        self.txn = core.txn   # the transaction manager (transactional.id set), else None
        self.requests_sent = 0

    # ------------------------------------------------------------------ the loop

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._task = asyncio.ensure_future(self._run())

    @property
    def started(self) -> bool:
        return self._task is not None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        """Cancel the loop and any InitProducerId under way."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        if self._pid_task is not None:
            self._pid_task.cancel()
        if self._txn_task is not None:
            self._txn_task.cancel()

    async def _run(self) -> None:
        loop = self.loop
        assert loop is not None  # started
        w = self.wakeup
        handed_over = self.handoff.items
        linger_ms = self.config.linger_ms
        try:
            while True:
                fut = w.arm(loop)
                timeout = self.step()
                if fut.done() or timeout == 0:
                    continue
                w.at_ms = float("inf") if timeout is None else now_ms() + timeout
                if handed_over and (timeout is None or timeout > linger_ms):
                    # handed over after step took the handoff and before at_ms was set: that
                    # sender saw the loop running and did not wake it
                    w.at_ms = 0
                    await asyncio.sleep(0)   # let responses in before the next pass
                    continue
                h = None if timeout is None else loop.call_later(timeout / 1000, _wake, fut)
                await fut
                w.at_ms = 0
                if h is not None:
                    h.cancel()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001
            log.exception("producer sender loop crashed")
            with self.lock:
                self.core.go_fatal(KafkaClientError("producer sender loop crashed; see the log"))
                done = self.core.take_completions()
            self.delivery.deliver(done)

    def step(self) -> int | None:
        """One pass of the sender: returns ms to sleep (None = until woken)."""
        now = now_ms()
        sleep: int | None = 100
        if self.handoff.items:
            self.handoff.take(now)
        with self.lock:
            core = self.core
            req = core.producer_id_request(now)
            if req is not None:
                self._pid_task = asyncio.ensure_future(self._init_producer_id(*req))
            else:
                wait = core.producer_id_wait_ms(now)
                if wait is not None:
                    sleep = wait
            if self.txn is not None:
                # before `ready`: an AddPartitionsToTxn answered lets its partitions drain now
                wake = self._txn_pass(now)
                if wake is not None:
                    sleep = wake if sleep is None else min(sleep, wake)
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
                        t = self.cluster.start_connect(node)
                        if t is not None:
                            t.add_done_callback(lambda _f: self.wakeup.set())
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
        self.delivery.deliver(done)
        return sleep

    def completed(self) -> None:
        """After an answer: the loop's next pass sends what may now go, then delivers. Without a
        running loop (closing, or it crashed) the outcomes are delivered here, so that none waits
        forever."""
        if self.running:
            self.wakeup.set()
            return
        with self.lock:
            done = self.core.take_completions()
        self.delivery.deliver(done)

    # ------------------------------------------------------------------ Produce

    def _send_produce(self, conn: Connection, node: int, batches: list, now: int) -> None:
        version = conn.version(ApiKey.PRODUCE)
        assert version is not None  # every Kafka broker advertises Produce
        if self.txn is not None and not self.txn.transaction_v2:
            # from v12 a transactional Produce asks the leader to add the partition (V2's meaning)
            version = min(version, txn_wire.LAST_V1[ApiKey.PRODUCE])
        ids = self.cluster.topic_ids
        if version >= 13 and any(b.tp.topic not in ids for b in batches):
            version = 12
        topics: dict[Any, list] = {}
        for b in batches:
            key = ids[b.tp.topic] if version >= 13 else b.tp.topic
            topics.setdefault(key, []).append((b.tp.partition, b.encoded))
        body = produce.encode_request_parts(version, self.config.acks, self.config.request_timeout_ms,
                                            topics, self.config.transactional_id)
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
        assert self.loop is not None  # started
        timer = self.loop.call_later(self.config.request_timeout_ms / 1000, self._request_timed_out,
                                     conn, fut)
        fut.add_done_callback(lambda f: self.on_produce_done(node, version, batches, f, timer))

    def _request_timed_out(self, conn: Connection, fut: asyncio.Future) -> None:
        if not fut.done():
            # Kafka closes the connection on a request timeout: every in-flight request on it
            # then fails and is retried under its sequence
            conn.fail(BrokerConnectionError(
                f"request to {conn.addr} timed out after request.timeout.ms="
                f"{self.config.request_timeout_ms}"))

    def on_produce_done(self, node: int, version: int, batches: list, fut: asyncio.Future,
                        timer: asyncio.TimerHandle) -> None:
        """A Produce request's answer, or its failure, for the core."""
        timer.cancel()
        now = now_ms()
        try:
            body = fut.result()
            topics = produce.decode_response(version, body)
        except BaseException as e:  # noqa: BLE001 - connection lost or garbage: outcome unknown
            with self.lock:
                self.core.on_request_failed(node, batches, now, str(e))
            self.completed()
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
        pairs = [(b, results.get((b.tp.topic, b.tp.partition), missing)) for b in batches]
        with self.lock:
            self.core.on_response(node, pairs, now)
        self.completed()

    # ------------------------------------------------------------------ transactions

    def _txn_pass(self, now: int) -> int | None:
        """Under the lock: start the manager's next request, if one is due and none is on the
        wire; ms until a backed-off request becomes due."""
        txn = self.txn
        assert txn is not None  # only for a transactional producer
        self._report_features(txn)
        out = txn.next_request(now)
        if out is not None:
            self._txn_task = asyncio.ensure_future(self._txn_request(out.request, out.node))
            return None
        wake = txn.next_wake_ms(now)
        return None if wake is None else max(0, wake - now)

    async def _txn_request(self, request: Any, node: int | None) -> None:
        txn = self.txn
        assert txn is not None  # only for a transactional producer
        api = txn_wire.API_OF[type(request)]
        try:
            conn = await (self.cluster.any_connection() if node is None
                          else self.cluster.connection(node))
            v = conn.version(api)
            two_pc = txn_wire.two_phase_version(request, conn.broker_versions)
            if two_pc is not None:
                v = two_pc if two_pc >= 0 else None
            if v is None:
                answer = txn_wire.error_response(request, ErrorCode.UNSUPPORTED_VERSION)
            else:
                if two_pc is None:
                    v = txn_wire.version(request, v)
                if api == ApiKey.INIT_PRODUCER_ID:
                    with self.lock:
                        txn.coordinator_versions(v)
                body = await asyncio.wait_for(conn.request(api, v, txn_wire.encode(request, v)),
                                              self.config.request_timeout_ms / 1000)
                answer = txn_wire.decode(request, v, body)
                if isinstance(request, FindCoordinatorRequest):
                    self._learn_coordinator(answer)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - no answer: the manager finds the coordinator again
            log.info("%s failed (%r); retrying", type(request).__name__, e)
            with self.lock:
                txn.on_request_failed(now_ms())
        else:
            with self.lock:
                self._report_features(txn)   # what this request's connection told, before the answer
                txn.on_response(answer, now_ms())
        finally:
            self._txn_task = None
        self.completed()

    _V2_VERSIONS = ((ApiKey.END_TXN, 5), (ApiKey.PRODUCE, 12), (ApiKey.TXN_OFFSET_COMMIT, 5))

    def _report_features(self, txn: Any) -> None:
        """The finalized transaction.version as the freshest ApiVersions answer says, counted
        only where the brokers speak V2's request versions (franz-go's check: a broker that
        finalizes it without them would refuse the un-added partitions)."""
        cluster = self.cluster
        level = cluster.finalized_features.get(TRANSACTION_VERSION, 0)
        if level >= 2 and any((cluster.version(api) or 0) < v for api, v in self._V2_VERSIONS):
            level = 1
        txn.features(level, cluster.features_epoch)

    def _learn_coordinator(self, answer: Any) -> None:
        """A coordinator the metadata has not named yet (another listener, a new broker) can
        still be connected to: FindCoordinator gave its address."""
        if answer.error_code == ErrorCode.NONE and answer.node_id not in self.cluster.brokers:
            self.cluster.brokers[answer.node_id] = BrokerEntry(answer.node_id, answer.host,
                                                               answer.port)

    # ------------------------------------------------------------------ InitProducerId

    async def _init_producer_id(self, pid: int, epoch: int) -> None:
        try:
            await self._init_producer_id_once(pid, epoch)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - e.g. a garbled answer: never leave it in progress
            log.exception("InitProducerId handling failed; retrying")
            with self.lock:
                self.core.producer_id_retry_later(e, now_ms())
            self.wakeup.set()

    async def _init_producer_id_once(self, pid: int, epoch: int) -> None:
        core = self.core
        try:
            conn = await self.cluster.any_connection()
            v = conn.version(ApiKey.INIT_PRODUCER_ID)
            if v is None:
                with self.lock:
                    core.on_init_producer_id_unsupported()
                return
            pid, epoch = core.init_producer_id_fields(pid, epoch, v)
            answer = await self._init_producer_id_request(conn, v, pid, epoch)
            with self.lock:
                fresh = core.on_init_producer_id(pid, *answer, now_ms())
            if fresh:
                answer = await self._init_producer_id_request(conn, v, -1, -1)
                with self.lock:
                    core.on_init_producer_id(pid, *answer, now_ms(), retried=True)
        except (TimeoutError, BrokerConnectionError, OSError) as e:
            log.info("InitProducerId failed (%r); retrying", e)
            with self.lock:
                core.producer_id_retry_later(e, now_ms())
            self.wakeup.set()
            return
        with self.lock:
            done = core.take_completions()
        self.delivery.deliver(done)
        self.wakeup.set()

    async def _init_producer_id_request(self, conn: Connection, v: int, pid: int, epoch: int
                                        ) -> tuple[int, int, int]:
        body = await asyncio.wait_for(
            conn.request(ApiKey.INIT_PRODUCER_ID, v, init_producer_id.encode_request(v, pid, epoch)),
            self.config.request_timeout_ms / 1000)
        return init_producer_id.decode_response(v, body)
