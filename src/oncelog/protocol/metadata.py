"""MetadataResponse v1-v12 written by hand, because topics may carry our tagged field 10000
`MessageFormatVersion` (int8, flexible versions, sent only when a topic's record format is below
v2) that tells a producer with `enable.idempotence=requested` to fall back before it sends."""
from __future__ import annotations

import uuid
from dataclasses import dataclass

from oncelog.protocol.primitives import I8, I16, I32, NULL_UUID, array_len, string, tagged_fields

TAG_MESSAGE_FORMAT_VERSION = 10000
_AUTHORIZED_OPERATIONS_OMITTED = -2147483648


@dataclass(slots=True)
class BrokerEntry:
    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(slots=True)
class PartitionEntry:
    index: int
    error_code: int = 0
    leader_id: int = -1
    leader_epoch: int = 0


@dataclass(slots=True)
class TopicEntry:
    name: str | None
    error_code: int = 0
    topic_id: uuid.UUID = NULL_UUID
    partitions: tuple[PartitionEntry, ...] = ()
    message_format_magic: int = 2
    extra_tags: dict[int, bytes] | None = None  # the controller's own fields for brokers


def encode_response(version: int, brokers: list[BrokerEntry], cluster_id: str | None,
                    controller_id: int, topics: list[TopicEntry]) -> bytes:
    flex = version >= 9
    out = []
    if version >= 3:
        out.append(I32.pack(0))  # throttle time
    out.append(array_len(len(brokers), flex))
    for b in brokers:
        out.append(I32.pack(b.node_id) + string(b.host, flex) + I32.pack(b.port) + string(b.rack, flex))
        if flex:
            out.append(b"\x00")
    if version >= 2:
        out.append(string(cluster_id, flex))
    out.append(I32.pack(controller_id))
    out.append(array_len(len(topics), flex))
    for t in topics:
        out.append(I16.pack(t.error_code) + string(t.name, flex))
        if version >= 10:
            out.append(t.topic_id.bytes)
        out.append(b"\x00")  # is_internal
        out.append(array_len(len(t.partitions), flex))
        for p in t.partitions:
            replicas = I32.pack(p.leader_id) if p.leader_id >= 0 else b""
            count = 1 if replicas else 0
            out.append(I16.pack(p.error_code) + I32.pack(p.index) + I32.pack(p.leader_id))
            if version >= 7:
                out.append(I32.pack(p.leader_epoch))
            out.append(array_len(count, flex) + replicas)  # replica nodes
            out.append(array_len(count, flex) + replicas)  # in-sync replicas
            if version >= 5:
                out.append(array_len(0, flex))  # offline replicas
            if flex:
                out.append(b"\x00")
        if version >= 8:
            out.append(I32.pack(_AUTHORIZED_OPERATIONS_OMITTED))
        if flex:
            tags = dict(t.extra_tags or {})
            if t.message_format_magic < 2:
                tags[TAG_MESSAGE_FORMAT_VERSION] = I8.pack(t.message_format_magic)
            out.append(tagged_fields(tags))
    if 8 <= version <= 10:
        out.append(I32.pack(_AUTHORIZED_OPERATIONS_OMITTED))
    if flex:
        out.append(b"\x00")
    return b"".join(out)


def decode_response(version: int, body) -> tuple[list[BrokerEntry], list[TopicEntry]]:
    """The inverse of `encode_response` (flexible versions 9-12), keeping every tagged field of a
    topic in `extra_tags`; used by brokers to read the controller's view."""
    from oncelog.protocol.primitives import Reader
    r = Reader(body)
    r.i32()  # throttle
    brokers = []
    for _ in range(r.array_len(True)):
        node, host, port, rack = r.i32(), r.string(True), r.i32(), r.string(True)
        r.skip_tags()
        brokers.append(BrokerEntry(node, host or "", port, rack))
    r.string(True)  # cluster id
    r.i32()  # controller id
    topics = []
    for _ in range(r.array_len(True)):
        code, name = r.i16(), r.string(True)
        topic_id = r.uuid() if version >= 10 else NULL_UUID
        r.boolean()
        parts = []
        for _ in range(r.array_len(True)):
            pcode, index, leader, epoch = r.i16(), r.i32(), r.i32(), r.i32()
            for _ in range(3):  # replicas, isr, offline replicas
                for _ in range(r.array_len(True)):
                    r.i32()
            r.skip_tags()
            parts.append(PartitionEntry(index, pcode, leader, epoch))
        if 8 <= version:
            r.i32()  # topic authorized operations
        tags = {k: bytes(v) for k, v in r.tags().items()}
        magic = tags.pop(TAG_MESSAGE_FORMAT_VERSION, None)
        topics.append(TopicEntry(name, code, topic_id, tuple(parts), magic[0] if magic else 2, tags or None))
    return brokers, topics
