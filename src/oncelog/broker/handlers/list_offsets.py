"""ListOffsets (API 2), v1-v6: earliest (-2), latest (-1), or the first offset whose batch
timestamp is at or after a given time. (v7's max-timestamp lookup is not served yet.)"""
from __future__ import annotations

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

API_KEY = ApiKey.LIST_OFFSETS
LATEST, EARLIEST = -1, -2


def handle(broker, version: int, body) -> bytes:
    request = entities.decode_request(API_KEY, version, body)
    rb = entities.ResponseBuilder(API_KEY, version)
    topics = []
    for t in request.topics:
        parts = []
        for p in t.partitions:
            code, ts, offset = _lookup(broker, str(t.name), int(p.partition_index), int(p.timestamp))
            parts.append(rb("ListOffsetsPartitionResponse", partition_index=p.partition_index,
                            error_code=code, timestamp=ts, offset=offset, leader_epoch=0,
                            old_style_offsets=(offset,) if offset >= 0 else ()))
        topics.append(rb("ListOffsetsTopicResponse", name=t.name, partitions=tuple(parts)))
    return rb.encode(throttle_time=0, topics=tuple(topics))


def _lookup(broker, topic: str, index: int, timestamp: int) -> tuple[int, int, int]:
    partition = broker.logs.get_partition(topic, index)
    if partition is None:
        return broker.logs.partition_error(topic, index), -1, -1
    try:
        if timestamp == LATEST:
            return ErrorCode.NONE, -1, partition.high_watermark
        if timestamp == EARLIEST:
            return ErrorCode.NONE, -1, partition.log_start_offset
        if timestamp < 0:
            return ErrorCode.UNSUPPORTED_VERSION, -1, -1
        found = partition.log.offset_for_timestamp(timestamp)
    except KafkaProtocolError as e:
        return e.code, -1, -1
    if found is None:
        return ErrorCode.NONE, -1, -1
    offset, ts = found
    return ErrorCode.NONE, ts, offset
