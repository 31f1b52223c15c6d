"""DeleteRecords (API 21), v0-v2: move a partition's log start offset (-1: to the high
watermark). Producer state is snapshotted first so it outlives the deleted batches."""
from __future__ import annotations

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

API_KEY = ApiKey.DELETE_RECORDS


def handle(broker, version: int, body) -> bytes:
    request = entities.decode_request(API_KEY, version, body)
    rb = entities.ResponseBuilder(API_KEY, version)
    topics = []
    for t in request.topics:
        parts = []
        for p in t.partitions:
            partition = broker.logs.get_partition(str(t.name), int(p.partition_index))
            code, low = ErrorCode.NONE, -1
            if partition is None:
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
