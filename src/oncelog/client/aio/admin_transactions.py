"""Transactions as the admin client sees them (kafka-transactions' requests): DescribeTransactions
at each id's coordinator; a transaction ended from outside in the two ways Kafka's tools have —
fencing its transactional id (InitProducerId, as `Admin.fenceProducers`: the coordinator aborts
the open transaction and bumps the epoch) and aborting a hanging transaction on one partition
(`Admin.abortTransaction`: DescribeProducers finds the producer whose transaction starts at the
given offset, WriteTxnMarkers writes its ABORT marker; brokers accept it from the cluster
credential's principal only)."""
from __future__ import annotations

import asyncio
import time
from typing import NamedTuple

from oncelog.client.aio.admin_base import AdminError, ask
from oncelog.client.aio.admin_groups import TRANSACTION_KEY, coordinator
from oncelog.client.aio.cluster import Cluster
from oncelog.client.aio.list_offsets import leader_of
from oncelog.client.errors import KafkaClientError
from oncelog.client.types import TopicPartition
from oncelog.protocol import init_producer_id
from oncelog.protocol.api import ApiKey
from oncelog.protocol.entities import millis
from oncelog.protocol.errors import ErrorCode

_RETRY_FENCE = {ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR}


class TransactionDescription(NamedTuple):
    transactional_id: str
    state: str                  # Kafka's names: Empty, Ongoing, PrepareCommit, CompleteAbort, ...
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    start_ms: int               # -1: no transaction started
    partitions: tuple[TopicPartition, ...]


class ProducerState(NamedTuple):
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int   # -1: no open transaction on this partition


class TransactionAdmin:
    """The admin client's transaction methods (mixed into AIOAdminClient)."""

    cluster: Cluster

    async def describe_transaction(self, transactional_id: str) -> TransactionDescription:
        conn = await coordinator(self.cluster, transactional_id, TRANSACTION_KEY)
        _, r = await ask(conn, ApiKey.DESCRIBE_TRANSACTIONS, lambda rq: rq.encode(
            transactional_ids=(transactional_id,)), self.cluster.timeout_s)
        s = r.transaction_states[0]
        if s.error_code:
            raise AdminError(s.error_code, f"describe transaction {transactional_id}")
        start = millis(s.transaction_start_time)
        return TransactionDescription(
            str(s.transactional_id), s.transaction_state, int(s.producer_id), int(s.producer_epoch),
            millis(s.transaction_timeout), start if s.transaction_state not in ("Empty", "") else -1,
            tuple(TopicPartition(str(t.topic), int(p)) for t in s.topics for p in t.partitions))

    async def partition_producers(self, tp: TopicPartition) -> list[ProducerState]:
        """The active producers of one partition (DescribeProducers, asked of its leader)."""
        conn = await self.cluster.connection(await leader_of(self.cluster, tp))
        _, r = await ask(conn, ApiKey.DESCRIBE_PRODUCERS, lambda rq: rq.encode(
            topics=(rq("TopicRequest", name=tp.topic, partition_indexes=(tp.partition,)),)), self.cluster.timeout_s)
        out = []
        for t in r.topics:
            for p in t.partitions:
                if p.error_code:
                    raise AdminError(p.error_code, f"describe producers of {tp.topic}-{tp.partition}",
                                     p.error_message)
                out += [ProducerState(int(s.producer_id), int(s.producer_epoch), int(s.last_sequence),
                                      int(s.last_timestamp), int(s.coordinator_epoch),
                                      int(s.current_txn_start_offset)) for s in p.active_producers]
        return out

    async def abort_hanging_transaction(self, tp: TopicPartition, start_offset: int) -> ProducerState:
        """Write an ABORT marker for the transaction open on `tp` since `start_offset`; returns the
        producer it belonged to."""
        found = [p for p in await self.partition_producers(tp) if p.current_txn_start_offset == start_offset]
        if not found:
            raise KafkaClientError(f"no open transaction on {tp.topic}-{tp.partition} starts at offset "
                                   f"{start_offset} (`transactions describe-producers` lists them)")
        p = found[0]
        conn = await self.cluster.connection(await leader_of(self.cluster, tp))
        _, r = await ask(conn, ApiKey.WRITE_TXN_MARKERS, lambda rq: rq.encode(markers=(
            rq("WritableTxnMarker", producer_id=p.producer_id, producer_epoch=p.producer_epoch,
               transaction_result=False, coordinator_epoch=p.coordinator_epoch, topics=(
                   rq("WritableTxnMarkerTopic", name=tp.topic, partition_indexes=(tp.partition,)),)),)),
            self.cluster.timeout_s)
        for m in r.markers:
            for t in m.topics:
                for part in t.partitions:
                    if part.error_code:
                        raise AdminError(part.error_code, f"abort the transaction of producer {p.producer_id} "
                                                          f"on {tp.topic}-{tp.partition}")
        return p

    async def fence_transactional_id(self, transactional_id: str) -> tuple[int, int]:
        """Fence the producers of `transactional_id` (their open transaction is aborted); returns
        the (producer id, epoch) that fenced them."""
        deadline = time.monotonic() + self.cluster.timeout_s
        delay = 0.05
        while True:
            conn = await coordinator(self.cluster, transactional_id, TRANSACTION_KEY)
            v = conn.version(ApiKey.INIT_PRODUCER_ID)
            if v is None:
                raise KafkaClientError(f"broker {conn.addr} does not support InitProducerId")
            body = await asyncio.wait_for(conn.request(ApiKey.INIT_PRODUCER_ID, v, init_producer_id.encode_request(
                v, transactional_id=transactional_id, transaction_timeout_ms=60000)), self.cluster.timeout_s)
            code, pid, epoch = init_producer_id.decode_response(v, body)
            if code == ErrorCode.NONE:
                return pid, epoch
            if code not in _RETRY_FENCE or time.monotonic() > deadline:
                raise AdminError(code, f"fence transactional id {transactional_id}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
