"""OffsetFetch (API 9), v1-v9: committed offsets, -1 where none (null topics: all of them).
v7 `require_stable` (KIP-447): a partition with transactional offsets still pending answers
UNSTABLE_OFFSET_COMMIT (retriable) instead of an offset its transaction may yet replace.
v8 asks for several groups at once, each answered with its own error; v9 names the member and its
epoch, checked for a consumer group (UNKNOWN_MEMBER_ID, STALE_MEMBER_EPOCH; Kafka's
validateOffsetFetch), not for a classic one. A commit whose fsync is under way is waited for
(Kafka reads a group at its last committed offset): an offset answered never goes back after a
crash (NOT_COORDINATOR if that fsync failed).
Needs DESCRIBE on the group (else GROUP_AUTHORIZATION_FAILED, for that group); topics need
DESCRIBE: a named one is answered TOPIC_AUTHORIZATION_FAILED, and with null topics those not
described are left out."""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from oncelog.broker.security.authorization import (
    GROUP,
    TOPIC,
    Op,
    authorize,
    authorized_names,
    describable_topics,
    require,
)
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.OFFSET_FETCH
FIRST_BATCHED = 8
E = ErrorCode


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    stable = bool(getattr(r, "require_stable", False))
    if version < FIRST_BATCHED:
        require(broker, Op.DESCRIBE, GROUP, str(r.group_id))
        error, topics = await _group(broker, rb, str(r.group_id), r.topics, stable, None, -1,
                                     "OffsetFetchResponseTopic", "OffsetFetchResponsePartition")
        return rb.encode(throttle_time=0, topics=topics, error_code=error)
    groups = []
    for g in r.groups:
        if not authorize(broker, Op.DESCRIBE, GROUP, str(g.group_id)):
            groups.append(rb("OffsetFetchResponseGroup", group_id=g.group_id, topics=(),
                             error_code=E.GROUP_AUTHORIZATION_FAILED))
            continue
        error, topics = await _group(broker, rb, str(g.group_id), g.topics, stable, getattr(g, "member_id", None),
                                     int(getattr(g, "member_epoch", -1)), "OffsetFetchResponseTopics",
                                     "OffsetFetchResponsePartitions")
        groups.append(rb("OffsetFetchResponseGroup", group_id=g.group_id, topics=topics, error_code=error))
    return rb.encode(throttle_time=0, groups=tuple(groups))


async def _group(broker: BrokerServices, rb: entities.ResponseBuilder, group_id: str, asked: Any, stable: bool,
                 member_id: str | None, member_epoch: int,
                 topic_cls: str, partition_cls: str) -> tuple[int, tuple[Any, ...]]:
    """(group error, topics) for one group."""
    if not broker.coordinates(group_id):
        return E.NOT_COORDINATOR, ()
    if not await broker.groups.offsets_flushed(group_id) or not broker.coordinates(group_id):
        return E.NOT_COORDINATOR, ()
    error = broker.groups.consumer.validate_fetch(group_id, member_id, member_epoch)
    if error:
        return error, ()
    committed = broker.groups.committed(group_id)
    unstable = broker.groups.unstable(group_id) if stable else set()
    wanted: dict[str, list[int]]
    if asked is None:
        wanted = defaultdict(list)
        described = describable_topics(broker, {t for t, _p in committed})
        for (topic, partition) in sorted(committed):
            if topic in described:
                wanted[topic].append(partition)
    else:
        wanted = {str(t.name): [int(i) for i in t.partition_indexes] for t in asked}
        described = authorized_names(broker, Op.DESCRIBE, TOPIC, wanted)
    topics = []
    for name, partitions in wanted.items():
        if name not in described:
            topics.append(rb(topic_cls, name=name, partitions=tuple(
                rb.error(partition_cls, E.TOPIC_AUTHORIZATION_FAILED, partition_index=i, metadata=None)
                for i in partitions)))
            continue
        parts = []
        for index in partitions:
            c = committed.get((name, index))
            if (name, index) in unstable:
                parts.append(rb.error(partition_cls, E.UNSTABLE_OFFSET_COMMIT, partition_index=index, metadata=None))
                continue
            parts.append(rb(partition_cls, partition_index=index, committed_offset=c.offset if c else -1,
                            committed_leader_epoch=c.leader_epoch if c else -1,
                            metadata=c.metadata if c else "", error_code=E.NONE))
        topics.append(rb(topic_cls, name=name, partitions=tuple(parts)))
    return E.NONE, tuple(topics)


def error_response(version: int, request: Any, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    if version >= FIRST_BATCHED:
        return rb.encode_error(code, groups=tuple(
            rb("OffsetFetchResponseGroup", group_id=g.group_id, topics=(), error_code=code) for g in request.groups))
    return rb.encode_error(code, topics=tuple(
        rb.error("OffsetFetchResponseTopic", code, name=t.name, partitions=tuple(
            rb.error("OffsetFetchResponsePartition", code, partition_index=i, metadata=None)
            for i in t.partition_indexes))
        for t in request.topics or ()))
