"""DeleteRecords (API 21), v0-v2: move a partition's log start offset (-1: to the high
watermark). Producer state is snapshotted first so it outlives the deleted batches. Needs DELETE
on the topic (TOPIC_AUTHORIZATION_FAILED); an internal topic's records are never deleted
(INVALID_TOPIC_EXCEPTION, as Kafka's ReplicaManager answers)."""
from __future__ import annotations

from typing import Any

from oncelog.broker.security.authorization import TOPIC, Op, authorized_names
from oncelog.broker.security.internal_topics import refusal
from oncelog.broker.services import BrokerServices
from oncelog.core.topic_names import is_internal
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

API_KEY = ApiKey.DELETE_RECORDS


async def handle(broker: BrokerServices, version: int, request: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    topics = []
    deletable = authorized_names(broker, Op.DELETE, TOPIC, (str(t.name) for t in request.topics))
    for t in request.topics:
        parts = []
        internal = str(t.name) in deletable and is_internal(str(t.name))
        if internal:
            refusal("delete records of", str(t.name))
        for p in t.partitions:
            partition = broker.logs.get_partition(str(t.name), int(p.partition_index))
            code: int
            code, low = ErrorCode.NONE, -1
            if str(t.name) not in deletable:
                code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif internal:
                code = ErrorCode.INVALID_TOPIC_EXCEPTION
            elif partition is None:
                code = broker.logs.partition_error(str(t.name), int(p.partition_index))
            else:
                offset = partition.high_watermark if int(p.offset) == -1 else int(p.offset)
                try:
                    if offset < 0 or offset > partition.high_watermark:
                        raise KafkaProtocolError(ErrorCode.OFFSET_OUT_OF_RANGE)
                    if offset > partition.log_start_offset:
                        partition.delete_records_before(offset)
                    low = partition.log_start_offset
                except KafkaProtocolError as e:
                    code = e.code
            parts.append(rb("DeleteRecordsPartitionResult", partition_index=p.partition_index,
                            low_watermark=low, error_code=code))
        topics.append(rb("DeleteRecordsTopicResult", name=t.name, partitions=tuple(parts)))
    return rb.encode(throttle_time=0, topics=tuple(topics))


def error_response(version: int, request: Any, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode_error(code, topics=tuple(
        rb.error("DeleteRecordsTopicResult", code, name=t.name, partitions=tuple(
            rb.error("DeleteRecordsPartitionResult", code, partition_index=p.partition_index)
            for p in t.partitions))
        for t in request.topics))
