"""Metadata v0-v12 written by hand, in both directions (clients and brokers read what brokers and
the controller write), because topics may carry our tagged field 10000 `MessageFormatVersion`
(int8, flexible versions, sent only when a topic's record format is below v2) that tells a
producer with `enable.idempotence=requested` to fall back before it sends; the controller adds
tags of its own for brokers (`TopicEntry.extra_tags`).

v0 (still served by Kafka 4.x) differs beyond missing fields: its topics array is never null, and
an empty one asks for all topics (from v1, null asks for all and empty for none)."""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from oncelog.protocol.primitives import I8, I16, I32, NULL_UUID, Buf, Reader, array_len, string, tagged_fields

TAG_MESSAGE_FORMAT_VERSION = 10000
AUTHORIZED_OPERATIONS_OMITTED = -2147483648
# Kafka's internal topics (Topic.isInternal): the group and transaction coordinators' logs
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})


def encode_request(version: int, topics: list[str] | None, allow_auto_create: bool = False) -> bytes:
    """MetadataRequest for `topics` by name (None: all topics)."""
    flex = version >= 9
    out = []
    if topics is None and version == 0:
        out.append(array_len(0, flex))
    elif topics is None:
        out.append(array_len(None, flex))
    else:
        out.append(array_len(len(topics), flex))
        for t in topics:
            if version >= 10:
                out.append(NULL_UUID.bytes)  # topic id: zero = look up by name
            out.append(string(t, flex))
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
    leader_epoch: int = -1


@dataclass(slots=True)
class TopicEntry:
    name: str | None
    error_code: int = 0
    topic_id: uuid.UUID = NULL_UUID
    partitions: tuple[PartitionEntry, ...] = ()
    message_format_magic: int | None = None  # tag 10000, sent below 2; None: not stated
    extra_tags: dict[int, bytes] | None = None  # the controller's own fields for brokers
    authorized_operations: int = AUTHORIZED_OPERATIONS_OMITTED  # KIP-430 bitfield, v8+, when asked
    is_internal: bool = False   # v1+: a topic the broker owns (`__transaction_state`)


@dataclass(slots=True)
class MetadataResponse:
    brokers: dict[int, BrokerEntry]
    cluster_id: str | None
    controller_id: int
    topics: dict[str, TopicEntry] = field(default_factory=dict)  # by name ("" for a nameless one)


def encode_response(version: int, brokers: list[BrokerEntry], cluster_id: str | None,
                    controller_id: int, topics: list[TopicEntry],
                    cluster_authorized_operations: int = AUTHORIZED_OPERATIONS_OMITTED) -> bytes:
    flex = version >= 9
    out = []
    if version >= 3:
        out.append(I32.pack(0))  # throttle time
    out.append(array_len(len(brokers), flex))
    for b in brokers:
        out.append(I32.pack(b.node_id) + string(b.host, flex) + I32.pack(b.port))
        if version >= 1:
            out.append(string(b.rack, flex))
        if flex:
            out.append(b"\x00")
    if version >= 2:
        out.append(string(cluster_id, flex))
    if version >= 1:
        out.append(I32.pack(controller_id))
    out.append(array_len(len(topics), flex))
    for t in topics:
        out.append(I16.pack(t.error_code) + string(t.name, flex))
        if version >= 10:
            out.append(t.topic_id.bytes)
        if version >= 1:
            out.append(b"\x01" if t.is_internal else b"\x00")
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
            out.append(I32.pack(t.authorized_operations))
        if flex:
            tags = dict(t.extra_tags or {})
            if t.message_format_magic is not None and t.message_format_magic < 2:
                tags[TAG_MESSAGE_FORMAT_VERSION] = I8.pack(t.message_format_magic)
            out.append(tagged_fields(tags))
    if 8 <= version <= 10:
        out.append(I32.pack(cluster_authorized_operations))
    if flex:
        out.append(b"\x00")
    return b"".join(out)


def decode_response(version: int, buf: Buf, pos: int = 0) -> MetadataResponse:
    """A MetadataResponse body at `pos`; a topic's tags other than 10000 are kept in `extra_tags`,
    its partitions sorted by index."""
    flex = version >= 9
    r = Reader(buf, pos)
    if version >= 3:
        r.i32()  # throttle
    brokers = {}
    for _ in range(r.array_len(flex)):
        node, host, port = r.i32(), r.string(flex), r.i32()
        rack = r.string(flex) if version >= 1 else None
        if flex:
            r.skip_tags()
        brokers[node] = BrokerEntry(node, host or "", port, rack)
    cluster_id = r.string(flex) if version >= 2 else None
    info = MetadataResponse(brokers, cluster_id, r.i32() if version >= 1 else -1)
    for _ in range(r.array_len(flex)):
        code, name = r.i16(), r.string(flex)
        topic_id = r.uuid() if version >= 10 else NULL_UUID
        internal = r.boolean() if version >= 1 else False
        parts = []
        for _ in range(r.array_len(flex)):
            pcode, index, leader = r.i16(), r.i32(), r.i32()
            epoch = r.i32() if version >= 7 else -1
            for _ in range(3 if version >= 5 else 2):  # replicas, in-sync replicas, offline replicas
                for _ in range(r.array_len(flex)):
                    r.i32()
            if flex:
                r.skip_tags()
            parts.append(PartitionEntry(index, pcode, leader, epoch))
        if version >= 8:
            r.i32()  # topic authorized operations
        t = TopicEntry(name, code, topic_id, tuple(sorted(parts, key=lambda p: p.index)), is_internal=internal)
        if flex:
            tags = {k: bytes(v) for k, v in r.tags().items()}
            magic = tags.pop(TAG_MESSAGE_FORMAT_VERSION, None)
            t.message_format_magic = magic[0] if magic else None
            t.extra_tags = tags or None
        info.topics[name or ""] = t
    return info
