"""Produce v3-v14, broker side, written by hand: it is the hot path, and v14's topic responses
carry tagged fields kio does not know.

v14 (KIP-1269) is v13 on the wire plus tag 1 `ProducerStateBatchesToRetain` (int32, the topic's
`producer.state.batches.to.retain`, default 5) for every partition that exists, written twice until
the KIP settles: on each PartitionProduceResponse (the KIP's prose; tag 1 beside CurrentLeader's
tag 0) and on each TopicProduceResponse (a reading of its JSON diff). Range-mode topics add our tag
10000 `MaxInFlightSequenceNumber` (int32) on the TopicProduceResponse: its presence means range mode,
and tag 1 still carries the per-partition batch limit there.
Record sets stay memoryviews into the request frame; nothing is decoded per record here.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from oncelog.protocol.primitives import (I16, I32, I64, Reader, array_len, string, tagged_fields)

TAG_BATCHES_TO_RETAIN = 1
TAG_MAX_IN_FLIGHT_SEQUENCE_NUMBER = 10000
# a partition's tagged fields when tag 1 is its only one: one field, tag 1, four bytes
_PARTITION_TAG_1 = b"\x01\x01\x04"


@dataclass(slots=True)
class ProduceRequest:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    # (topic name, or topic id from v13) -> [(partition index, record set or None)]
    topics: list[tuple[str | uuid.UUID, list[tuple[int, memoryview | None]]]]


def decode_request(version: int, body) -> ProduceRequest:
    flex = version >= 9
    r = Reader(body)
    transactional_id = r.string(flex)
    acks, timeout_ms = r.i16(), r.i32()
    topics = []
    for _ in range(r.array_len(flex)):
        topic = r.uuid() if version >= 13 else r.string(flex)
        parts = []
        for _ in range(r.array_len(flex)):
            index = r.i32()
            parts.append((index, r.bytes_view(flex)))
            if flex:
                r.skip_tags()
        if flex:
            r.skip_tags()
        topics.append((topic, parts))
    if flex:
        r.skip_tags()
    return ProduceRequest(transactional_id, acks, timeout_ms, topics)


@dataclass(slots=True)
class PartitionResponse:
    index: int
    error_code: int = 0
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    error_message: str | None = None
    record_errors: list[tuple[int, str | None]] = field(default_factory=list)
    batches_to_retain: int | None = None   # v14 tag 1; None: not sent (no such partition)


@dataclass(slots=True)
class TopicResponse:
    topic: str | uuid.UUID
    partitions: list[PartitionResponse]
    batches_to_retain: int | None = None   # v14 tag 1; None: not sent (no such topic)
    max_in_flight_sequence_number: int | None = None


def encode_response(version: int, topics: list[TopicResponse], throttle_ms: int = 0) -> bytes:
    flex = version >= 9
    out = [array_len(len(topics), flex)]
    for t in topics:
        out.append(t.topic.bytes if version >= 13 else string(t.topic, flex))
        out.append(array_len(len(t.partitions), flex))
        for p in t.partitions:
            out.append(I32.pack(p.index) + I16.pack(p.error_code) + I64.pack(p.base_offset)
                       + I64.pack(p.log_append_time))
            if version >= 5:
                out.append(I64.pack(p.log_start_offset))
            if version >= 8:
                out.append(array_len(len(p.record_errors), flex))
                for batch_index, message in p.record_errors:
                    out.append(I32.pack(batch_index) + string(message, flex))
                    if flex:
                        out.append(b"\x00")
                out.append(string(p.error_message, flex))
            if flex:
                out.append(_PARTITION_TAG_1 + I32.pack(p.batches_to_retain)
                           if version >= 14 and p.batches_to_retain is not None else b"\x00")
        if flex:
            tags = {}
            if version >= 14:
                if t.batches_to_retain is not None:
                    tags[TAG_BATCHES_TO_RETAIN] = I32.pack(t.batches_to_retain)
                if t.max_in_flight_sequence_number is not None:
                    tags[TAG_MAX_IN_FLIGHT_SEQUENCE_NUMBER] = I32.pack(t.max_in_flight_sequence_number)
            out.append(tagged_fields(tags))
    out.append(I32.pack(throttle_ms))
    if flex:
        out.append(b"\x00")
    return b"".join(out)
