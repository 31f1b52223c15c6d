"""Fetch (API 4-12): whole batches from each partition's log, long polling up to MaxWaitMs until
MinBytes are available. Fetch sessions (KIP-227) are declined by answering session id 0, which
every client handles by sending full requests.

Isolation (v4+): read_uncommitted reads up to the high watermark and gets a null
AbortedTransactions; read_committed (1) reads up to the last stable offset, never beyond, and gets
the aborted transactions overlapping what it was given (Kafka's collectAbortedTxns, from the
`.txnindex` of the segment holding the fetch offset onwards). LastStableOffset is always filled
in; with no transaction open it is the high watermark.

Authorization: READ on each topic, else TOPIC_AUTHORIZATION_FAILED for its partitions. Quota
(`consumer_byte_rate`): a Fetch asks for at most what the quota allows in its window; one over
the quota is answered at once with its throttle time and no records (its bytes taken back, as
Kafka's unrecordQuotaSensor), and the connection is muted for that time (KIP-219)."""
from __future__ import annotations

import time
from typing import Any

from oncelog.broker.security.authorization import TOPIC, Op, authorized_names
from oncelog.broker.security.quotas import throttle
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol import fetch as wire
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.storage.partition import Partition

API_KEY = ApiKey.FETCH
READ_COMMITTED = 1
# aborted-index entries read per partition before a read_committed answer is shortened to what
# is known complete (bounded work per request; see core.txn.partition.collect_aborted)
MAX_ABORTED_SCAN = 1000


async def handle(broker: BrokerServices, version: int, request: Any) -> bytes | list[bytes | wire.OpaqueRecords]:
    max_wait_s = entities.millis(request.max_wait) / 1000
    deadline = time.monotonic() + max_wait_s
    max_bytes = min(int(request.max_bytes), broker.config["fetch.max.bytes"], broker.quotas.fetch_window_bytes())
    min_bytes = min(int(request.min_bytes), max_bytes)
    readable = authorized_names(broker, Op.READ, TOPIC, (str(t.topic) for t in request.topics))
    while True:
        topics, size = _read(broker, request, max_bytes, readable)
        remaining = deadline - time.monotonic()
        if size >= min_bytes or remaining <= 0 or not _any_readable(topics):
            throttle_ms = broker.quotas.record_fetch(size)
            if throttle_ms:
                broker.quotas.unrecord_fetch(size)
                throttle(throttle_ms)
                return wire.encode_response(version, [], throttle_ms=throttle_ms)
            broker.metrics.count_errors("Fetch", (p.error_code for _name, parts in topics for p in parts))
            if size:
                _count_out(broker, request, topics)
            return wire.encode_response_parts(version, topics)
        await broker.wait_for_data(remaining)


def _count_out(broker: BrokerServices, request: Any,
               topics: list[tuple[str, list[wire.PartitionData]]]) -> None:
    """Bytes and records answered per topic. The records go out as file regions, unread: their
    count is the offsets they take the consumer over (from its fetch offset to the region's
    end), with no per-batch work."""
    asked = {(str(t.topic), int(fp.partition)): int(fp.fetch_offset)
             for t in request.topics for fp in t.partitions}
    for name, parts in topics:
        size = records = 0
        for p in parts:
            if p.records:
                size += len(p.records)
                end = getattr(p.records, "end_offset", None)
                if end is not None:
                    records += max(0, end - asked.get((name, p.index), end))
        if size:
            broker.metrics.fetched(name, size, records)


def _any_readable(topics: list[tuple[str, list[wire.PartitionData]]]) -> bool:
    # a request whose partitions all failed will not be helped by waiting
    return any(p.error_code == 0 for _name, parts in topics for p in parts)


def _read(broker: BrokerServices, request: Any, max_bytes: int, readable: set[str]
          ) -> tuple[list[tuple[str, list[wire.PartitionData]]], int]:
    """At most `max_bytes` of records over all partitions and PartitionMaxBytes from each, except
    that the first batch of the first partition with data is returned whole even if it is larger,
    so that a consumer always progresses (Kafka's ReplicaManager.readFromLog, KIP-74). A later
    partition whose first batch does not fit in what is left gets nothing this time."""
    budget = max_bytes
    total = 0
    topics = []
    committed = int(getattr(request, "isolation_level", 0)) == READ_COMMITTED
    for t in request.topics:
        name = str(t.topic)
        parts = []
        if name not in readable:
            topics.append((name, [wire.PartitionData(int(fp.partition), ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                                  for fp in t.partitions]))
            continue
        for fp in t.partitions:
            index = int(fp.partition)
            partition = broker.logs.get_partition(name, index)
            if partition is None:
                parts.append(wire.PartitionData(index, broker.logs.partition_error(name, index)))
                continue
            data = wire.PartitionData(index, 0, partition.high_watermark, partition.log_start_offset,
                                      last_stable_offset=partition.last_stable_offset)
            limit = min(int(fp.partition_max_bytes), budget)
            first = total == 0
            if committed:
                data.aborted_transactions = []
            if limit > 0 or first:
                try:
                    if committed:
                        _read_committed(partition, data, int(fp.fetch_offset), limit, first)
                    else:
                        data.records = partition.read_region(int(fp.fetch_offset), limit, min_one=first) or b""
                except KafkaProtocolError as e:
                    data.error_code = e.code
            total += len(data.records)
            budget = max(0, budget - len(data.records))
            parts.append(data)
        topics.append((name, parts))
    return topics, total


def _read_committed(partition: Partition, data: wire.PartitionData, offset: int, limit: int, first: bool) -> None:
    """Records below the LSO, and the aborted transactions among them."""
    records = partition.read_region(offset, limit, min_one=first, max_offset=data.last_stable_offset)
    if records is None:
        return
    end = records.end_offset
    query = partition.aborted_transactions(offset, end, MAX_ABORTED_SCAN)
    if query.upper < end:
        if query.upper > offset:  # complete below query.upper only: return that much
            records.close()
            records = partition.read_region(offset, limit, min_one=first, max_offset=query.upper)
            if records is None:
                return
            end = records.end_offset
        else:  # one transaction open across more aborts than the bound: no progress without all
            query = partition.aborted_transactions(offset, end)
    data.records = records
    data.aborted_transactions = [(t.producer_id, t.first_offset) for t in query.transactions
                                 if t.first_offset < end]


def error_response(version: int, request: Any, code: int) -> bytes:
    return wire.encode_response(version, [(str(t.topic), [wire.PartitionData(int(p.partition), code)
                                                          for p in t.partitions]) for t in request.topics],
                                error_code=code)
