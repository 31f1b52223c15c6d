"""Fetch (API 4-12): whole batches from each partition's log, long polling up to MaxWaitMs until
MinBytes are available. Fetch sessions (KIP-227) are declined by answering session id 0, which
every client handles by sending full requests."""
from __future__ import annotations

import time

from oncelog.protocol import entities
from oncelog.protocol import fetch as wire
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import KafkaProtocolError

API_KEY = ApiKey.FETCH


async def handle(broker, version: int, request) -> bytes:
    max_wait_s = entities.millis(request.max_wait) / 1000
    deadline = time.monotonic() + max_wait_s
    max_bytes = min(int(request.max_bytes), broker.config["fetch.max.bytes"])
    min_bytes = min(int(request.min_bytes), max_bytes)
    while True:
        topics, size = _read(broker, request, max_bytes)
        remaining = deadline - time.monotonic()
        if size >= min_bytes or remaining <= 0 or not _any_readable(topics):
            return wire.encode_response(version, topics)
        await broker.wait_for_data(remaining)


def _any_readable(topics) -> bool:
    # a request whose partitions all failed will not be helped by waiting
    return any(p.error_code == 0 for _name, parts in topics for p in parts)


def _read(broker, request, max_bytes: int):
    """At most `max_bytes` of records over all partitions and PartitionMaxBytes from each, except
    that the first batch of the first partition with data is returned whole even if it is larger,
    so that a consumer always progresses (Kafka's ReplicaManager.readFromLog, KIP-74). A later
    partition whose first batch does not fit in what is left gets nothing this time."""
    budget = max_bytes
    total = 0
    topics = []
    for t in request.topics:
        name = str(t.topic)
        parts = []
        for fp in t.partitions:
            index = int(fp.partition)
            partition = broker.logs.get_partition(name, index)
            if partition is None:
                parts.append(wire.PartitionData(index, broker.logs.partition_error(name, index)))
                continue
            data = wire.PartitionData(index, 0, partition.high_watermark, partition.log_start_offset)
            limit = min(int(fp.partition_max_bytes), budget)
            first = total == 0
            if limit > 0 or first:
                try:
                    data.records = partition.read(int(fp.fetch_offset), limit, min_one=first)
                except KafkaProtocolError as e:
                    data.error_code = e.code
                    broker.metrics.errors.labels("fetch", e.code.name).inc()
            total += len(data.records)
            budget = max(0, budget - len(data.records))
            parts.append(data)
        topics.append((name, parts))
    return topics, total


def error_response(version: int, request, code: int) -> bytes:
    return wire.encode_response(version, [(str(t.topic), [wire.PartitionData(int(p.partition), code)
                                                          for p in t.partitions]) for t in request.topics],
                                error_code=code)
