"""OffsetFetch (API 9), v1-v7: committed offsets, -1 where none (null topics: all of them).
v7 `require_stable` (KIP-447): a partition with transactional offsets still pending answers
UNSTABLE_OFFSET_COMMIT (retriable) instead of an offset its transaction may yet replace.
Needs DESCRIBE on the group (else GROUP_AUTHORIZATION_FAILED); topics need DESCRIBE: a named one is
answered TOPIC_AUTHORIZATION_FAILED, and with null topics those not described are left out."""
from __future__ import annotations

from collections import defaultdict

from oncelog.broker.authorization import GROUP, TOPIC, Op, authorized_names, require
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.OFFSET_FETCH


async def handle(broker, version: int, r) -> bytes:
    require(broker, Op.DESCRIBE, GROUP, str(r.group_id))
    rb = entities.ResponseBuilder(API_KEY, version)
    if not broker.coordinates(str(r.group_id)):
        return rb.encode(throttle_time=0, topics=(), error_code=ErrorCode.NOT_COORDINATOR)
    committed = broker.groups.committed(str(r.group_id))
    unstable = broker.groups.unstable(str(r.group_id)) if getattr(r, "require_stable", False) else set()
    wanted: dict[str, list[int]]
    if r.topics is None:
        wanted = defaultdict(list)
        described = authorized_names(broker, Op.DESCRIBE, TOPIC, {t for t, _p in committed}, audit=False)
        for (topic, partition) in sorted(committed):
            if topic in described:
                wanted[topic].append(partition)
    else:
        wanted = {str(t.name): [int(i) for i in t.partition_indexes] for t in r.topics}
        described = authorized_names(broker, Op.DESCRIBE, TOPIC, wanted)
    topics = []
    for name, partitions in wanted.items():
        parts = []
        if name not in described:
            topics.append(rb("OffsetFetchResponseTopic", name=name, partitions=tuple(
                rb.error("OffsetFetchResponsePartition", ErrorCode.TOPIC_AUTHORIZATION_FAILED, partition_index=i,
                         metadata=None) for i in partitions)))
            continue
        for index in partitions:
            c = committed.get((name, index))
            if (name, index) in unstable:
                parts.append(rb.error("OffsetFetchResponsePartition", ErrorCode.UNSTABLE_OFFSET_COMMIT,
                                      partition_index=index, metadata=None))
                continue
            parts.append(rb("OffsetFetchResponsePartition", partition_index=index,
                            committed_offset=c.offset if c else -1,
                            committed_leader_epoch=c.leader_epoch if c else -1,
                            metadata=c.metadata if c else "", error_code=ErrorCode.NONE))
        topics.append(rb("OffsetFetchResponseTopic", name=name, partitions=tuple(parts)))
    return rb.encode(throttle_time=0, topics=tuple(topics), error_code=ErrorCode.NONE)


def error_response(version: int, request, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode_error(code, topics=tuple(
        rb.error("OffsetFetchResponseTopic", code, name=t.name, partitions=tuple(
            rb.error("OffsetFetchResponsePartition", code, partition_index=i, metadata=None)
            for i in t.partition_indexes))
        for t in request.topics or ()))
