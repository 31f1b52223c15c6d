"""DescribeProducers (API 61, v0): the producers a partition's state tracks, for anyone to inspect.

Each partition answers from `Partition.producer_state` (the coordinator epoch of the last marker,
-1 if none) and its open transactions (the first offset of the producer's, -1 if none). An
unknown topic or partition gets UNKNOWN_TOPIC_OR_PARTITION in its own entry; the rest of the request is still answered.
A topic needs READ (TOPIC_AUTHORIZATION_FAILED in its partitions' entries).
"""
from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from kio.schema.describe_producers.v0.request import DescribeProducersRequest
from kio.schema.describe_producers.v0.response import (
    DescribeProducersResponse,
    PartitionResponse,
    ProducerState,
    TopicResponse,
)
from kio.schema.errors import ErrorCode as KioError
from kio.schema.types import ProducerId, TopicName
from kio.static.primitive import i32, i32Timedelta, i64

from oncelog.broker.security.authorization import TOPIC, Op, authorized_names
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.storage.partition import Partition

API_KEY = ApiKey.DESCRIBE_PRODUCERS
VERSIONS = (0, 0)


def describe_producers(request: DescribeProducersRequest,
                       get_partition: Callable[[str, int], Partition | None],
                       readable: set[str] | None = None) -> DescribeProducersResponse:
    """`get_partition(topic, index)` returns the Partition, or None when this broker has none;
    topics outside `readable` (None: all) are refused."""
    topics = []
    for t in request.topics:
        parts = []
        if readable is not None and str(t.name) not in readable:
            topics.append(TopicResponse(name=TopicName(t.name), partitions=tuple(
                PartitionResponse(partition_index=i32(index), error_code=KioError.topic_authorization_failed,
                                  error_message=None, active_producers=()) for index in t.partition_indexes)))
            continue
        for index in t.partition_indexes:
            partition = get_partition(str(t.name), int(index))
            if partition is None:
                parts.append(PartitionResponse(partition_index=i32(index),
                                               error_code=KioError.unknown_topic_or_partition,
                                               error_message=f"no partition {t.name}-{index} on this broker",
                                               active_producers=()))
                continue
            parts.append(PartitionResponse(partition_index=i32(index), error_code=KioError.none,
                                           error_message=None,
                                           active_producers=tuple(_producers(partition))))
        topics.append(TopicResponse(name=TopicName(t.name), partitions=tuple(parts)))
    return DescribeProducersResponse(throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
                                     topics=tuple(topics))


def _producers(partition: Partition) -> list[ProducerState]:
    return [ProducerState(producer_id=ProducerId(e.producer_id), producer_epoch=i32(e.epoch),
                          last_sequence=i32(e.last_sequence), last_timestamp=i64(e.last_timestamp),
                          coordinator_epoch=i32(e.coordinator_epoch),
                          current_txn_start_offset=i64(partition.txns.open_first_offset(e.producer_id)))
            for e in partition.producer_state.entries()]


async def handle(broker: BrokerServices, version: int, request: Any) -> bytes:
    readable = authorized_names(broker, Op.READ, TOPIC, (str(t.name) for t in request.topics))
    return entities.encode(describe_producers(request, broker.logs.get_partition, readable))


def error_response(version: int, request: Any, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode_error(code, topics=tuple(
        rb.error("TopicResponse", code, name=t.name, partitions=tuple(
            rb.error("PartitionResponse", code, partition_index=i, error_message=None)
            for i in t.partition_indexes))
        for t in request.topics))
