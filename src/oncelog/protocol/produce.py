"""Produce v0-v14 written by hand, in both directions (the client writes requests and reads
responses, the broker the reverse): it is the hot path, and v14's responses carry tagged fields kio
does not know.

v0-v2 (Kafka 3.x serves them; 4.0 dropped them) carry v0/v1 message sets and have no
transactional id; v0 answers have no throttle time, v0-v1 no log append time.

v14 (KIP-1269) is v13 on the wire plus tag 1 `ProducerStateBatchesToRetain` (int32, the topic's
`producer.state.batches.to.retain`, default 5) for every partition that exists, written twice until
the KIP settles: on each PartitionProduceResponse (the KIP's prose; tag 1 beside CurrentLeader's
tag 0) and on each TopicProduceResponse (a reading of its JSON diff). Range-mode topics add our tag
10000 `MaxInFlightSequenceNumber` (int32) on the TopicProduceResponse: its presence means range mode,
and tag 1 still carries the per-partition batch limit there. A reader takes a partition's tag 1,
else its topic's; with neither a producer assumes 5.
Record sets stay memoryviews into the request frame and are written without a copy; nothing is
decoded per record here.
"""
from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from oncelog.protocol.primitives import I16, I32, I64, Buf, Reader, array_len, string, tagged_fields, uvarint

TAG_CURRENT_LEADER = 0
TAG_BATCHES_TO_RETAIN = 1
TAG_MAX_IN_FLIGHT_SEQUENCE_NUMBER = 10000
# a partition's tagged fields when tag 1 is its only one: one field, tag 1, four bytes
_PARTITION_TAG_1 = b"\x01\x01\x04"

TopicKey = str | uuid.UUID   # a topic's name (v3-12) or its id (v13+)


# ---------------------------------------------------------------- request

@dataclass(slots=True)
class ProduceRequest:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    # (topic name, or topic id from v13; None if a v3-12 client sent a null name)
    #   -> [(partition index, record set or None)]
    topics: list[tuple[TopicKey | None, list[tuple[int, memoryview | None]]]]


def encode_request(version: int, acks: int, timeout_ms: int,
                   topics: Mapping[TopicKey, Sequence[tuple[int, bytes | bytearray | memoryview]]],
                   transactional_id: str | None = None) -> bytes:
    """ProduceRequest body v0..v14 (v14 = v13 on the wire; below v3 without a transactional id).
    `topics` maps a topic name (v0-12) or topic id (v13+) to [(partition, record set bytes)]."""
    return b"".join(encode_request_parts(version, acks, timeout_ms, topics, transactional_id))


def encode_request_parts(version: int, acks: int, timeout_ms: int,
                         topics: Mapping[TopicKey, Sequence[tuple[int, bytes | bytearray | memoryview]]],
                         transactional_id: str | None = None) -> list[Buf]:
    """`encode_request` as a list of parts, so that the record sets are sent without a copy."""
    # the producer's per-request path: lengths inline rather than through primitives' helpers
    flex = version >= 9
    out: list[Buf] = [string(transactional_id, flex)] if version >= 3 else []
    out += [I16.pack(acks), I32.pack(timeout_ms), uvarint(len(topics) + 1) if flex else I32.pack(len(topics))]
    for topic, parts in topics.items():
        out.append(_topic_field(version, topic, flex))
        out.append(uvarint(len(parts) + 1) if flex else I32.pack(len(parts)))
        for index, records in parts:
            out.append(I32.pack(index))
            out.append(uvarint(len(records) + 1) if flex else I32.pack(len(records)))
            out.append(records)
            if flex:
                out.append(b"\x00")
        if flex:
            out.append(b"\x00")
    if flex:
        out.append(b"\x00")
    return out


def request_acks(version: int, body: Buf) -> int:
    """A Produce request's acks, read without the rest (acks=0 gets no answer: a proxy must know)."""
    r = Reader(body)
    if version >= 3:
        r.string(version >= 9)   # transactional id
    return r.i16()


def decode_request(version: int, body: Buf) -> ProduceRequest:
    flex = version >= 9
    r = Reader(body)
    transactional_id = r.string(flex) if version >= 3 else None
    acks, timeout_ms = r.i16(), r.i32()
    topics = []
    for _ in range(r.array_len(flex)):
        topic: TopicKey | None = r.uuid() if version >= 13 else r.string(flex)
        parts: list[tuple[int, memoryview | None]] = []
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


# ---------------------------------------------------------------- response

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
    leader_id: int = -1                    # CurrentLeader (tag 0, v10+), when a new leader is named
    leader_epoch: int = -1
    topic_batches_to_retain: int | None = None  # read only: its topic's tag 1 (v14+)

    @property
    def reported_batches_to_retain(self) -> int | None:
        """KIP-1269's window for this partition: its own field, else its topic's (None: neither
        was sent, and the producer assumes 5)."""
        return self.batches_to_retain if self.batches_to_retain is not None else self.topic_batches_to_retain


@dataclass(slots=True)
class TopicResponse:
    topic: TopicKey | None
    partitions: list[PartitionResponse]
    batches_to_retain: int | None = None   # v14 tag 1; None: not sent (no such topic)
    max_in_flight_sequence_number: int | None = None  # tag 10000: range mode's threshold


def encode_response(version: int, topics: list[TopicResponse], throttle_ms: int = 0) -> bytes:
    flex = version >= 9
    out = [array_len(len(topics), flex)]
    for t in topics:
        out.append(_topic_field(version, t.topic, flex))
        out.append(array_len(len(t.partitions), flex))
        for p in t.partitions:
            out.append(I32.pack(p.index) + I16.pack(p.error_code) + I64.pack(p.base_offset))
            if version >= 2:
                out.append(I64.pack(p.log_append_time))
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
                if p.leader_id < 0:
                    out.append(_PARTITION_TAG_1 + I32.pack(p.batches_to_retain)
                               if version >= 14 and p.batches_to_retain is not None else b"\x00")
                else:
                    out.append(tagged_fields(_partition_tags(version, p)))
        if flex:
            tags = {}
            if version >= 14:
                if t.batches_to_retain is not None:
                    tags[TAG_BATCHES_TO_RETAIN] = I32.pack(t.batches_to_retain)
                if t.max_in_flight_sequence_number is not None:
                    tags[TAG_MAX_IN_FLIGHT_SEQUENCE_NUMBER] = I32.pack(t.max_in_flight_sequence_number)
            out.append(tagged_fields(tags))
    if version >= 1:
        out.append(I32.pack(throttle_ms))
    if flex:
        out.append(b"\x00")
    return b"".join(out)


def _topic_field(version: int, topic: TopicKey | None, flex: bool) -> bytes:
    """A topic's id (v13+) or its name (v3-12)."""
    if isinstance(topic, uuid.UUID) != (version >= 13):
        raise TypeError(f"Produce v{version} names a topic by {'id' if version >= 13 else 'name'}, "
                        f"not by {topic!r}")
    return topic.bytes if isinstance(topic, uuid.UUID) else string(topic, flex)


def _partition_tags(version: int, p: PartitionResponse) -> dict[int, bytes]:
    tags = {}
    if version >= 10:
        tags[TAG_CURRENT_LEADER] = I32.pack(p.leader_id) + I32.pack(p.leader_epoch) + b"\x00"
    if version >= 14 and p.batches_to_retain is not None:
        tags[TAG_BATCHES_TO_RETAIN] = I32.pack(p.batches_to_retain)
    return tags


def decode_response(version: int, buf: Buf, pos: int = 0) -> list[TopicResponse]:
    """The topics of a ProduceResponse body starting at `pos` (what follows them is not read)."""
    flex = version >= 9
    r = Reader(buf, pos)
    topics = []
    for _ in range(r.array_len(flex)):
        topic: TopicKey | None = r.uuid() if version >= 13 else r.string(flex)
        parts = []
        for _ in range(r.array_len(flex)):
            p = PartitionResponse(r.i32(), r.i16(), r.i64())
            if version >= 2:
                p.log_append_time = r.i64()
            if version >= 5:
                p.log_start_offset = r.i64()
            if version >= 8:
                for _ in range(r.array_len(flex)):
                    p.record_errors.append((r.i32(), r.string(flex)))
                    if flex:
                        r.skip_tags()
                p.error_message = r.string(flex)
            if flex:
                tags = r.tags()
                if TAG_CURRENT_LEADER in tags and version >= 10:
                    lr = Reader(tags[TAG_CURRENT_LEADER])
                    p.leader_id, p.leader_epoch = lr.i32(), lr.i32()
                if TAG_BATCHES_TO_RETAIN in tags and version >= 14:
                    p.batches_to_retain = _window(tags[TAG_BATCHES_TO_RETAIN])
            parts.append(p)
        t = TopicResponse(topic, parts)
        if flex:
            tags = r.tags()
            if TAG_BATCHES_TO_RETAIN in tags and version >= 14:
                t.batches_to_retain = _window(tags[TAG_BATCHES_TO_RETAIN])
                for p in parts:
                    p.topic_batches_to_retain = t.batches_to_retain
            if TAG_MAX_IN_FLIGHT_SEQUENCE_NUMBER in tags:
                t.max_in_flight_sequence_number = I32.unpack_from(tags[TAG_MAX_IN_FLIGHT_SEQUENCE_NUMBER])[0]
        topics.append(t)
    return topics


def _window(value: Buf) -> int | None:
    """A window below 1 cannot be honoured (nothing could be sent): taken as absent."""
    n: int = I32.unpack_from(value)[0]
    return n if n >= 1 else None
