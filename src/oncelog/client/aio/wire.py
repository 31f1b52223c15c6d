"""Client-side encoding of requests and decoding of responses.

Most APIs go through `kio` entities. Produce (the hot path) and Metadata are hand-written here
because we need tagged fields that kio's generated schemas do not know: ProduceResponse v14 tag 1
`ProducerStateBatchesToRetain` (KIP-1269), which a broker may send on each PartitionProduceResponse
(the KIP's prose) and/or on each TopicProduceResponse (a reading of its JSON diff; oncelog sends
both), TopicProduceResponse tag 10000 `MaxInFlightSequenceNumber` (range mode), and
MetadataResponseTopic tag 10000 `MessageFormatVersion`.
"""
from __future__ import annotations

import io
import struct
import uuid
from dataclasses import dataclass, field
from typing import Any

from kio.serial import entity_reader, entity_writer

from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.primitives import Reader, uvarint  # noqa: F401  (re-exported for the client)

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
API_VERSIONS, CREATE_TOPICS, DELETE_TOPICS, DELETE_RECORDS, INIT_PRODUCER_ID = 18, 19, 20, 21, 22
DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS, DESCRIBE_PRODUCERS = 32, 44, 61

# first flexible version of each API we speak (request header v2 / response header v1 from there)
FIRST_FLEXIBLE = {PRODUCE: 9, FETCH: 12, LIST_OFFSETS: 6, METADATA: 9, API_VERSIONS: 3,
                  CREATE_TOPICS: 5, DELETE_TOPICS: 4, DELETE_RECORDS: 2, INIT_PRODUCER_ID: 2,
                  DESCRIBE_CONFIGS: 4, INCREMENTAL_ALTER_CONFIGS: 1, DESCRIBE_PRODUCERS: 0}

# versions this client can speak; the broker's ApiVersions answer narrows them
CLIENT_VERSIONS = {PRODUCE: (3, 14), FETCH: (4, 12), LIST_OFFSETS: (1, 7), METADATA: (1, 12),
                   API_VERSIONS: (0, 3), CREATE_TOPICS: (2, 7), DELETE_TOPICS: (1, 5),
                   DELETE_RECORDS: (0, 2), INIT_PRODUCER_ID: (0, 4), DESCRIBE_CONFIGS: (1, 4),
                   INCREMENTAL_ALTER_CONFIGS: (0, 1), DESCRIBE_PRODUCERS: (0, 0)}

TAG_BATCHES_TO_RETAIN = 1
TAG_MAX_INFLIGHT_SEQUENCES = 10000
TAG_MESSAGE_FORMAT_VERSION = 10000

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_HDR = struct.Struct(">hhi")


def flexible(api_key: int, version: int) -> bool:
    return version >= FIRST_FLEXIBLE.get(api_key, 1 << 15)


def request_header(api_key: int, version: int, correlation_id: int, client_id: str | None) -> bytes:
    cid = client_id.encode() if client_id is not None else None
    parts = [_HDR.pack(api_key, version, correlation_id),
             _I16.pack(-1) if cid is None else _I16.pack(len(cid)) + cid]
    # ApiVersions keeps header v2 for v3+ too; its *response* header stays v0
    if flexible(api_key, version):
        parts.append(b"\x00")
    return b"".join(parts)


def response_header_size(api_key: int, version: int, buf: bytes | memoryview) -> int:
    """Bytes of the response header (correlation id already checked by the connection)."""
    if api_key == API_VERSIONS or not flexible(api_key, version):
        return 4
    r = Reader(buf, 4)
    r.skip_tags()
    return r.pos


# ---------------------------------------------------------------- Produce (hand-written, hot path)

def encode_produce(version: int, acks: int, timeout_ms: int,
                   topics: dict[Any, list[tuple[int, bytes]]]) -> bytes:
    """ProduceRequest body v3..v14 (v14 = v13 on the wire). `topics` maps a topic name (v3-12) or
    topic id (uuid, v13+) to [(partition, record set bytes)]."""
    return b"".join(encode_produce_parts(version, acks, timeout_ms, topics))


def encode_produce_parts(version: int, acks: int, timeout_ms: int,
                         topics: dict[Any, list[tuple[int, bytes]]]) -> list[bytes]:
    """encode_produce as a list of parts, so that the record sets are written without a copy."""
    flex = version >= 9
    out = [b"\xff\xff" if not flex else b"\x00", _I16.pack(acks), _I32.pack(timeout_ms)]
    out.append(uvarint(len(topics) + 1) if flex else _I32.pack(len(topics)))
    for topic, parts in topics.items():
        if version >= 13:
            out.append(topic.bytes)
        else:
            name = topic.encode()
            out.append(uvarint(len(name) + 1) + name if flex else _I16.pack(len(name)) + name)
        out.append(uvarint(len(parts) + 1) if flex else _I32.pack(len(parts)))
        for index, records in parts:
            out.append(_I32.pack(index))
            out.append(uvarint(len(records) + 1) if flex else _I32.pack(len(records)))
            out.append(records)
            if flex:
                out.append(b"\x00")
        if flex:
            out.append(b"\x00")
    if flex:
        out.append(b"\x00")
    return out


@dataclass
class ProducePartitionResponse:
    index: int
    error_code: int
    base_offset: int
    log_append_time: int = -1
    log_start_offset: int = -1
    error_message: str | None = None
    leader_id: int = -1          # CurrentLeader (tag 0, v10+) when the broker names a new leader
    leader_epoch: int = -1
    batches_to_retain: int | None = None        # its own tag 1 (v14+), None when absent
    topic_batches_to_retain: int | None = None  # its topic's tag 1 (v14+), None when absent

    @property
    def reported_batches_to_retain(self) -> int | None:
        """KIP-1269's window for this partition: its own field, else its topic's (None: neither
        was sent, and the producer assumes 5)."""
        return self.batches_to_retain if self.batches_to_retain is not None else self.topic_batches_to_retain


@dataclass
class ProduceTopicResponse:
    topic: Any                   # name (v3-12) or topic id (v13+)
    partitions: list[ProducePartitionResponse]
    batches_to_retain: int | None = None         # tag 1 (KIP-1269), None when absent
    max_inflight_sequences: int | None = None    # tag 10000 (range mode), None when absent


def decode_produce_response(version: int, buf, pos: int = 0) -> list[ProduceTopicResponse]:
    flex = version >= 9
    r = Reader(buf, pos)
    topics = []
    for _ in range(r.array_len(flex)):
        topic = r.uuid() if version >= 13 else r.string(flex)
        parts = []
        for _ in range(r.array_len(flex)):
            p = ProducePartitionResponse(r.i32(), r.i16(), r.i64())
            if version >= 2:
                p.log_append_time = r.i64()
            if version >= 5:
                p.log_start_offset = r.i64()
            if version >= 8:
                for _ in range(r.array_len(flex)):
                    r.i32()
                    r.string(flex)
                p.error_message = r.string(flex)
            if flex:
                tags = r.tags()
                if 0 in tags and version >= 10:
                    lr = Reader(tags[0])
                    p.leader_id, p.leader_epoch = lr.i32(), lr.i32()
                    lr.skip_tags()
                if TAG_BATCHES_TO_RETAIN in tags and version >= 14:
                    p.batches_to_retain = _window(tags[TAG_BATCHES_TO_RETAIN])
            parts.append(p)
        t = ProduceTopicResponse(topic, parts)
        if flex:
            tags = r.tags()
            if TAG_BATCHES_TO_RETAIN in tags and version >= 14:
                t.batches_to_retain = _window(tags[TAG_BATCHES_TO_RETAIN])
                for p in parts:
                    p.topic_batches_to_retain = t.batches_to_retain
            if TAG_MAX_INFLIGHT_SEQUENCES in tags:
                t.max_inflight_sequences = _I32.unpack_from(tags[TAG_MAX_INFLIGHT_SEQUENCES])[0]
        topics.append(t)
    return topics


def _window(value) -> int | None:
    """A window below 1 cannot be honoured (nothing could be sent): taken as absent."""
    n = _I32.unpack_from(value)[0]
    return n if n >= 1 else None


# ---------------------------------------------------------------- Metadata (hand-written: tag 10000)

def encode_metadata(version: int, topics: list[str] | None, allow_auto_create: bool = False) -> bytes:
    flex = version >= 9
    out = []
    if topics is None:
        out.append(b"\x00" if flex else _I32.pack(-1))
    else:
        out.append(uvarint(len(topics) + 1) if flex else _I32.pack(len(topics)))
        for t in topics:
            if version >= 10:
                out.append(b"\x00" * 16)  # topic id: zero = look up by name
            name = t.encode()
            out.append(uvarint(len(name) + 1) + name if flex else _I16.pack(len(name)) + name)
            if flex:
                out.append(b"\x00")
    if version >= 4:
        out.append(b"\x01" if allow_auto_create else b"\x00")
    if 8 <= version <= 10:
        out.append(b"\x00")  # include cluster authorized operations
    if version >= 8:
        out.append(b"\x00")  # include topic authorized operations
    if flex:
        out.append(b"\x00")
    return b"".join(out)


@dataclass
class BrokerInfo:
    node_id: int
    host: str
    port: int


@dataclass
class PartitionInfo:
    index: int
    error_code: int
    leader: int
    leader_epoch: int = -1


@dataclass
class TopicInfo:
    name: str
    error_code: int
    topic_id: uuid.UUID | None
    partitions: list[PartitionInfo]
    message_format_version: int | None = None  # our tag 10000: present only below v2


@dataclass
class MetadataInfo:
    brokers: dict[int, BrokerInfo]
    controller_id: int
    topics: dict[str, TopicInfo] = field(default_factory=dict)


def decode_metadata_response(version: int, buf, pos: int = 0) -> MetadataInfo:
    flex = version >= 9
    r = Reader(buf, pos)
    if version >= 3:
        r.i32()  # throttle
    brokers = {}
    for _ in range(r.array_len(flex)):
        node, host, port = r.i32(), r.string(flex), r.i32()
        if version >= 1:
            r.string(flex)  # rack
        if flex:
            r.skip_tags()
        brokers[node] = BrokerInfo(node, host or "", port)
    if version >= 2:
        r.string(flex)  # cluster id
    controller = r.i32() if version >= 1 else -1
    info = MetadataInfo(brokers, controller)
    for _ in range(r.array_len(flex)):
        err = r.i16()
        name = r.string(flex)
        tid = r.uuid() if version >= 10 else None
        if version >= 1:
            r.boolean()
        parts = []
        for _ in range(r.array_len(flex)):
            perr, idx, leader = r.i16(), r.i32(), r.i32()
            epoch = r.i32() if version >= 7 else -1
            for _ in range(2 if version < 5 else 3):
                for _ in range(r.array_len(flex)):
                    r.i32()
            if flex:
                r.skip_tags()
            parts.append(PartitionInfo(idx, perr, leader, epoch))
        if version >= 8:
            r.i32()
        t = TopicInfo(name or "", err, tid, sorted(parts, key=lambda p: p.index))
        if flex:
            tags = r.tags()
            if TAG_MESSAGE_FORMAT_VERSION in tags:
                t.message_format_version = tags[TAG_MESSAGE_FORMAT_VERSION][0]
        info.topics[t.name] = t
    return info


# ---------------------------------------------------------------- ApiVersions

def encode_api_versions(version: int) -> bytes:
    if version >= 3:
        name, ver = b"oncelog", b"0.1.0"
        return uvarint(len(name) + 1) + name + uvarint(len(ver) + 1) + ver + b"\x00"
    return b""


def decode_api_versions(version: int, buf, pos: int = 0) -> tuple[int, dict[int, tuple[int, int]]]:
    flex = version >= 3
    r = Reader(buf, pos)
    err = r.i16()
    apis = {}
    n = r.array_len(flex)
    for _ in range(n):
        key, lo, hi = r.i16(), r.i16(), r.i16()
        if flex:
            r.skip_tags()
        apis[key] = (lo, hi)
    return err, apis


# ---------------------------------------------------------------- kio entities

def encode_entity(entity) -> bytes:
    b = io.BytesIO()
    entity_writer(type(entity))(b, entity)
    return b.getvalue()


def decode_entity(cls, buf, pos: int = 0):
    value, _size = entity_reader(cls)(bytes(buf[pos:]) if pos else buf, 0)
    return value


def check(code: int, what: str = "", message: str | None = None) -> None:
    if code:
        raise KafkaProtocolError(code, f"{what}: {message}" if message else what or None)


# ---------------------------------------------------------------- InitProducerId (tiny, idempotent only)

def encode_init_producer_id(version: int, producer_id: int = -1, producer_epoch: int = -1) -> bytes:
    """transactional id null, timeout Integer.MAX_VALUE as the Java idempotent producer sends."""
    flex = version >= 2
    out = [b"\x00" if flex else _I16.pack(-1), _I32.pack(2**31 - 1)]
    if version >= 3:
        out.append(_I64.pack(producer_id) + _I16.pack(producer_epoch))
    if flex:
        out.append(b"\x00")
    return b"".join(out)


def decode_init_producer_id(version: int, buf, pos: int = 0) -> tuple[int, int, int]:
    """(error code, producer id, epoch)."""
    r = Reader(buf, pos)
    r.i32()
    return r.i16(), r.i64(), r.i16()
