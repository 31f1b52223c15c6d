"""What a partition leader asks the transaction coordinator before it appends a producer's first
transactional batch of a transaction (Kafka's AddPartitionsToTxnManager):

- verify (KIP-890 part 1, a Transactions V1 client: Produce up to v11, TxnOffsetCommit up to
  v4): is the partition in the producer's ongoing transaction? Nothing is written;
- add (KIP-890 part 2, a Transactions V2 client: Produce v12+, TxnOffsetCommit v5+): the
  partition joins the transaction, which the coordinator makes durable (Ongoing, marked V2).

The id's coordinator answers: this broker by a direct call, another broker by AddPartitionsToTxn
(v4 when only verifying, v5 when it adds) over the inter-broker link. Per destination broker one
request is in flight and what arrives meanwhile goes in the next one, one entry per transactional
id: checks of the same producer and epoch merge; one of another epoch or producer id replaces
the entry waiting, whose checks are answered INVALID_PRODUCER_EPOCH (an older epoch) or
NETWORK_EXCEPTION (retried by its producer), or is itself refused INVALID_PRODUCER_EPOCH when
older than the waiting one.

An add answered CONCURRENT_TRANSACTIONS (the producer's previous transaction is still writing its
markers, which Transactions V2 clients meet at the start of nearly every transaction) is asked
again for up to `add.partitions.to.txn.retry.backoff.max.ms`: of a coordinator on this broker as
soon as the transition it waits for is done, of another broker every
`add.partitions.to.txn.retry.backoff.ms`. Each attempt holds its own verification guard (the
caller's `begin`/`valid`/`end`), since the previous transaction's markers void the guards taken
before them.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from oncelog.broker.cluster.peers import Peers, PeerUnavailable
from oncelog.core.txn.log_format import TRANSACTION_STATE_TOPIC
from oncelog.core.txn.state import TV_2, TopicPartition
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

if TYPE_CHECKING:
    from oncelog.broker.config import BrokerConfig

log = logging.getLogger(__name__)
E = ErrorCode
_MOVED = (E.NOT_COORDINATOR, E.COORDINATOR_LOAD_IN_PROGRESS)

# The question a partition leader asks the coordinator: (transactional id, producer id, epoch,
# partitions, add?) -> error code per partition (`Broker.txn_check`: the manager's `ask`, or a test's)
TxnCheck = Callable[[str, int, int, list[TopicPartition], bool], Awaitable[dict[TopicPartition, int]]]


class Leader(Protocol):
    """What `check` uses of the partition leader's broker (`broker.services.BrokerServices`)."""
    config: BrokerConfig
    txn_check: TxnCheck | None

    @property
    def txn(self) -> _Coordinator: ...


class _Coordinator(Protocol):
    partitions: AddPartitionsManager


@dataclass(eq=False)
class _Entry:
    producer_id: int
    producer_epoch: int
    add: bool
    partitions: set[TopicPartition] = field(default_factory=set)
    waiters: list[asyncio.Future] = field(default_factory=list)

    def answer(self, codes: dict[TopicPartition, int] | int) -> None:
        for w in self.waiters:
            if not w.done():
                w.set_result(codes)


class AddPartitionsManager:
    def __init__(self, broker, service) -> None:
        self.broker = broker
        self.service = service
        self._peers = Peers(broker, "oncelog-txn-add-partitions")
        self._channels: dict[int, _Channel] = {}

    def close(self) -> None:
        for channel in self._channels.values():
            channel.stop()
        self._channels.clear()
        self._peers.close()

    async def backoff(self, transactional_id: str, remaining_s: float) -> None:
        """Before an add told CONCURRENT_TRANSACTIONS is asked again."""
        if self.service.coordinates(transactional_id):
            await self.service.transition_done(transactional_id, remaining_s)
        else:
            await asyncio.sleep(min(remaining_s, self.broker.config["add.partitions.to.txn.retry.backoff.ms"] / 1000))

    async def ask(self, tid: str, pid: int, epoch: int, tps: list[TopicPartition],
                  add: bool) -> dict[TopicPartition, int]:
        """One attempt (`broker.txn_check`): the coordinator's code per partition."""
        core = self.service.core
        p = core.partition_of(tid)
        if (self.broker.logs.leader(TRANSACTION_STATE_TOPIC, p)[0] == self.broker.node_id) != (p in core.owned()):
            # the id's partition moved since the coordinator's last tick: a stale cache here would
            # not know the producer (INVALID_PRODUCER_ID_MAPPING), or not yet serve it
            self.service.reconcile()
            core = self.service.core
        if add:
            answer = await self.service.execute(core.prepare_add_partitions(
                tid, pid, epoch, tps, self.broker.now_ms(), transaction_version=TV_2))
            codes = dict.fromkeys(tps, answer.error)
        else:
            codes = core.verify_partitions(tid, pid, epoch, tps)
        if any(code != E.NOT_COORDINATOR for code in codes.values()):
            return codes
        node = self.broker.logs.leader(TRANSACTION_STATE_TOPIC, p)[0]
        if node < 0 or node == self.broker.node_id:
            return dict.fromkeys(tps, E.COORDINATOR_NOT_AVAILABLE)  # none leads it, or it loads here
        channel = self._channels.get(node)
        if channel is None:
            channel = self._channels[node] = _Channel(self._peers, node)
        return await channel.submit(tid, _Entry(pid, epoch, add, set(tps)), tps)


async def check(broker: Leader, transactional_id: str, producer_id: int, producer_epoch: int,
                partitions: list[TopicPartition], add: bool, begin: Callable[[], Any],
                valid: Callable[[Any], bool], end: Callable[[Any], None]) -> dict[TopicPartition, int]:
    """NONE for each partition that is in the producer's ongoing transaction (after adding it,
    when `add`), else the coordinator's code; TRANSACTION_ABORTABLE when a marker for the
    producer voided the attempt's guard (`begin()` before asking, `valid(token)` after,
    `end(token)` always); COORDINATOR_NOT_AVAILABLE when no coordinator could answer. Each
    attempt asks `broker.txn_check` (the manager's `ask`, or a test's)."""
    if broker.txn_check is None:
        return dict.fromkeys(partitions, E.NONE)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + broker.config["add.partitions.to.txn.retry.backoff.max.ms"] / 1000
    out: dict[TopicPartition, int] = {}
    left = list(partitions)
    while True:
        token = begin()
        try:
            try:
                codes = await broker.txn_check(transactional_id, producer_id, producer_epoch, left, add)
            except (TimeoutError, OSError):
                codes = {}
            intact = valid(token)
        finally:
            end(token)
        for tp in left:
            code = codes.get(tp, E.COORDINATOR_NOT_AVAILABLE)
            out[tp] = E.TRANSACTION_ABORTABLE if code == E.NONE and not intact else code
        left = [tp for tp in left if out[tp] == E.CONCURRENT_TRANSACTIONS]
        remaining = deadline - loop.time()
        if not add or not left or remaining <= 0:
            return out
        await broker.txn.partitions.backoff(transactional_id, remaining)


class _Channel:
    """AddPartitionsToTxn to one coordinator broker: one request in flight, one entry per
    transactional id in the next."""

    def __init__(self, peers: Peers, node: int) -> None:
        self.peers, self.node = peers, node
        self._waiting: dict[str, _Entry] = {}
        self._task: asyncio.Task | None = None

    async def submit(self, tid: str, entry: _Entry, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        old = self._waiting.get(tid)
        if old is not None and (old.producer_id, old.producer_epoch, old.add) == (
                entry.producer_id, entry.producer_epoch, entry.add):
            old.partitions |= entry.partitions
            old.waiters.append(future)
        elif old is not None and old.producer_id == entry.producer_id and old.producer_epoch > entry.producer_epoch:
            return dict.fromkeys(tps, E.INVALID_PRODUCER_EPOCH)
        else:
            if old is not None:
                old.answer(E.INVALID_PRODUCER_EPOCH if old.producer_id == entry.producer_id
                           and old.producer_epoch < entry.producer_epoch else E.NETWORK_EXCEPTION)
            entry.waiters.append(future)
            self._waiting[tid] = entry
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain())
        codes = await future
        return dict.fromkeys(tps, codes) if isinstance(codes, int) else {tp: codes[tp] for tp in tps}

    async def _drain(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, {}
            try:
                answers = await self._request(batch)
            except (PeerUnavailable, KafkaProtocolError, ValueError) as e:
                log.info("AddPartitionsToTxn to broker %d failed: %s", self.node, e)
                answers = {}
            for tid, entry in batch.items():
                got = answers.get(tid, {})
                entry.answer({tp: _remote_code(got.get(tp)) for tp in entry.partitions})

    async def _request(self, batch: dict[str, _Entry]) -> dict[str, dict[TopicPartition, int]]:
        from oncelog.protocol import entities
        version = 5 if any(e.add for e in batch.values()) else 4   # v5: the adds are V2's
        mod = entities.module(ApiKey.ADD_PARTITIONS_TO_TXN, version, "request")
        txns = []
        for tid, e in batch.items():
            by_topic: dict[str, list[int]] = {}
            for topic, index in sorted(e.partitions):
                by_topic.setdefault(topic, []).append(index)
            txns.append(entities.make(
                mod.AddPartitionsToTxnTransaction, transactional_id=tid, producer_id=e.producer_id,
                producer_epoch=e.producer_epoch, verify_only=not e.add,
                topics=tuple(entities.make(mod.AddPartitionsToTxnTopic, name=t, partitions=tuple(ps))
                             for t, ps in by_topic.items())))
        r = await self.peers.request(self.node, ApiKey.ADD_PARTITIONS_TO_TXN, version, transactions=tuple(txns))
        if int(r.error_code):
            code = int(r.error_code)
            return {tid: dict.fromkeys(e.partitions, code) for tid, e in batch.items()}
        return {str(result.transactional_id): {(str(t.name), int(p.partition_index)): int(p.partition_error_code)
                                               for t in result.topic_results for p in t.results_by_partition}
                for result in r.results_by_transaction}

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for entry in self._waiting.values():
            entry.answer(E.NETWORK_EXCEPTION)
        self._waiting.clear()


def _remote_code(code: int | None) -> int:
    """No answer, or the coordinator moved or loads: the producer retries, as with no answer."""
    if code is None or code in _MOVED:
        return E.COORDINATOR_NOT_AVAILABLE
    return code
