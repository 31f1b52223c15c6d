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


async def handle(broker, version: int, body) -> bytes:
    request = entities.decode_request(API_KEY, version, body)
    max_wait_s = entities.millis(request.max_wait) / 1000
    deadline = time.monotonic() + max_wait_s
    while True:
        topics, size = _read(broker, request)
        remaining = deadline - time.monotonic()
        if size >= request.min_bytes or remaining <= 0 or not _any_readable(topics):
            return wire.encode_response(version, topics)
        await broker.wait_for_data(remaining)


def _any_readable(topics) -> bool:
    # a request whose partitions all failed will not be helped by waiting
    return any(p.error_code == 0 for _name, parts in topics for p in parts)


def _read(broker, request):
    budget = request.max_bytes
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
            # The first partition with data may exceed the budget (one whole batch at least), as in
            # Kafka; after that the request's max_bytes caps the response.
            limit = min(int(fp.partition_max_bytes), budget) if total else int(fp.partition_max_bytes)
            if limit > 0:
                try:
                    data.records = partition.read(int(fp.fetch_offset), limit)
                except KafkaProtocolError as e:
                    data.error_code = e.code
                    broker.metrics.errors.labels("fetch", e.code.name).inc()
            total += len(data.records)
            budget = max(0, budget - len(data.records))
            parts.append(data)
        topics.append((name, parts))
    return topics, total
