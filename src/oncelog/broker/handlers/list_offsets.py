"""ListOffsets (API 2), v1-v10, answered as Kafka answers them: earliest (-2) and earliest-local
(-4, the same without tiered storage) give the log start offset; latest (-1) the high watermark,
or under read_committed (v2+ isolation level 1) the last stable offset;
max-timestamp (-3) the first record holding the largest timestamp; latest-tiered (-5) offset -1
(nothing is tiered); a time >= 0 the first record whose timestamp is at or after it. A special
timestamp older than the version that introduced it is UNSUPPORTED_VERSION, and a partition named
twice is INVALID_REQUEST (Kafka's ReplicaManager.fetchOffset). A topic needs DESCRIBE (else
TOPIC_AUTHORIZATION_FAILED)."""
from __future__ import annotations

from collections import Counter
from typing import Any

from oncelog.broker.security.authorization import TOPIC, Op, authorized_names
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

API_KEY = ApiKey.LIST_OFFSETS
LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -1, -2, -3, -4, -5
# the first request version that may ask for each special timestamp
_SINCE_VERSION = {LATEST: 1, EARLIEST: 1, MAX_TIMESTAMP: 7, EARLIEST_LOCAL: 8, LATEST_TIERED: 9}
_NOT_FOUND = (ErrorCode.NONE, -1, -1, -1)


async def handle(broker: BrokerServices, version: int, request: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    named = Counter((str(t.name), int(p.partition_index)) for t in request.topics for p in t.partitions)
    duplicates = {tp for tp, n in named.items() if n > 1}
    topics = []
    committed = version >= 2 and int(getattr(request, "isolation_level", 0)) == 1
    described = authorized_names(broker, Op.DESCRIBE, TOPIC, (str(t.name) for t in request.topics))
    for t in request.topics:
        parts = []
        for p in t.partitions:
            index, timestamp = int(p.partition_index), int(p.timestamp)
            code: int
            if str(t.name) not in described:
                code, ts, offset, epoch = ErrorCode.TOPIC_AUTHORIZATION_FAILED, -1, -1, -1
            elif (str(t.name), index) in duplicates:
                code, ts, offset, epoch = ErrorCode.INVALID_REQUEST, -1, -1, -1
            elif timestamp < 0 and _SINCE_VERSION.get(timestamp, 1 << 15) > version:
                code, ts, offset, epoch = ErrorCode.UNSUPPORTED_VERSION, -1, -1, -1
            else:
                code, ts, offset, epoch = _lookup(broker, str(t.name), index, timestamp, committed)
            parts.append(rb("ListOffsetsPartitionResponse", partition_index=p.partition_index,
                            error_code=code, timestamp=ts, offset=offset, leader_epoch=epoch,
                            old_style_offsets=(offset,) if offset >= 0 else ()))
        topics.append(rb("ListOffsetsTopicResponse", name=t.name, partitions=tuple(parts)))
    return rb.encode(throttle_time=0, topics=tuple(topics))


def _lookup(broker: BrokerServices, topic: str, index: int, timestamp: int,
            committed: bool) -> tuple[int, int, int, int]:
    """(error, timestamp, offset, leader epoch) for one partition."""
    partition = broker.logs.get_partition(topic, index)
    if partition is None:
        return broker.logs.partition_error(topic, index), -1, -1, -1
    log = partition.log
    # what a consumer of this isolation level may read (Kafka's lastFetchableOffset)
    fetchable = partition.last_stable_offset if committed else partition.high_watermark
    try:
        if timestamp == LATEST:
            return ErrorCode.NONE, -1, fetchable, log.leader_epoch
        if partition.message_format_magic == 0 and timestamp != EARLIEST:
            # v0 messages carry no timestamp (Kafka: UnifiedLog.fetchOffsetByTimestamp)
            return ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT, -1, -1, -1
        if timestamp in (EARLIEST, EARLIEST_LOCAL):
            return ErrorCode.NONE, -1, partition.log_start_offset, log.leader_epoch
        if timestamp == LATEST_TIERED:
            return _NOT_FOUND
        found = log.offset_of_max_timestamp() if timestamp == MAX_TIMESTAMP else log.offset_for_timestamp(timestamp)
    except KafkaProtocolError as e:
        return e.code, -1, -1, -1
    if found is None or found.offset >= fetchable:
        # nothing at or after that time that a consumer may read yet
        return _NOT_FOUND
    return ErrorCode.NONE, found.timestamp, found.offset, found.leader_epoch


def error_response(version: int, request: Any, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode_error(code, topics=tuple(
        rb.error("ListOffsetsTopicResponse", code, name=t.name, partitions=tuple(
            rb.error("ListOffsetsPartitionResponse", code, partition_index=p.partition_index)
            for p in t.partitions))
        for t in request.topics))
