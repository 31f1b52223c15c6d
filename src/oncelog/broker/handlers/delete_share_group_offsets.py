"""DeleteShareGroupOffsets (API 92), v0 (kafka-share-groups.sh --delete-offsets,
Admin.deleteShareGroupOffsets): the share group's state of whole topics goes (Kafka's
DeleteShareGroupState), for a group without members. Each share-partition's deletion is a
tombstone in the group's state log (one group commit, answered once durable), and the next
ShareFetch of such a partition initializes it again at `share.auto.offset.reset`.

As Kafka: DELETE on the group (GROUP_AUTHORIZATION_FAILED, the whole answer), READ on each topic
(TOPIC_AUTHORIZATION_FAILED in its entry); a topic that does not exist, or on which the group has
no state, UNKNOWN_TOPIC_OR_PARTITION; the group's own errors answer at the top level without
topics: UNSUPPORTED_VERSION while `share.version` is 0, NOT_COORDINATOR on a broker without the
group's lease (and when it is lost before the write is durable), GROUP_ID_NOT_FOUND when the id
is no share group, NON_EMPTY_GROUP while it has members. A write that fails answers
KAFKA_STORAGE_ERROR for the topics it carried.

Bounded per request: a topic named twice is deleted once (its other entries INVALID_REQUEST), so a
request writes at most one tombstone per share-partition the group has."""
from __future__ import annotations

import functools
from typing import Any

from oncelog.broker.handlers.alter_share_group_offsets import NO_TOPIC_ID, refusal, stored, whole_answer
from oncelog.broker.security.authorization import TOPIC, Op, authorized_names
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.DELETE_SHARE_GROUP_OFFSETS
E = ErrorCode


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    share = broker.groups.share
    group = str(r.group_id or "")

    top = functools.partial(whole_answer, rb)

    refused = refusal(broker, Op.DELETE, group)
    if refused is not None:
        return top(*refused)
    readable = authorized_names(broker, Op.READ, TOPIC, (str(t.topic_name) for t in r.topics))
    answers: list[tuple[str, int, str | None]] = []   # (topic, code, message), in the request's order
    wanted: list[str] = []
    named: set[str] = set()
    for name in (str(t.topic_name) for t in r.topics):
        if name in named:
            answers.append((name, E.INVALID_REQUEST, f"{name} is named more than once."))
            continue
        named.add(name)
        if name not in readable:
            answers.append((name, E.TOPIC_AUTHORIZATION_FAILED, None))
        else:
            wanted.append(name)
    if not broker.coordinates(group):
        return top(E.NOT_COORDINATOR)
    if not share.is_share_group(group):
        return top(E.GROUP_ID_NOT_FOUND, f"Group {group} is not a share group.")
    if not share.is_empty(group):
        return top(E.NON_EMPTY_GROUP, f"Share group {group} has members: stop them before deleting its offsets.")
    initialized = share.initialized(group)
    write = 0
    deleted: list[str] = []
    for name in wanted:
        info = broker.logs.topics.get(name)
        if info is None:
            answers.append((name, E.UNKNOWN_TOPIC_OR_PARTITION, None))
            continue
        parts = sorted(p for tid, p in initialized if tid == info.topic_id)
        if not parts:
            answers.append((name, E.UNKNOWN_TOPIC_OR_PARTITION, "There is no offset information to delete."))
            continue
        for p in parts:
            write = max(write, share.drop(group, info.topic_id, p))
        deleted.append(name)
    failed = await stored(share, group, write)
    if failed is not None and failed[0] == E.NOT_COORDINATOR:
        return top(*failed)
    code, message = failed or (E.NONE, None)
    answers += [(name, code, message) for name in deleted]
    topics = []
    for name, c, m in answers:
        info = broker.logs.topics.get(name)
        topics.append(rb("DeleteShareGroupOffsetsResponseTopic", topic_name=name,
                         topic_id=info.topic_id if info is not None and name in readable else NO_TOPIC_ID,
                         error_code=c, error_message=m))
    return rb.encode(throttle_time=0, error_code=E.NONE, error_message=None, responses=tuple(topics))


def error_response(version: int, request: Any, code: int) -> bytes:
    return entities.ResponseBuilder(API_KEY, version).encode(throttle_time=0, error_code=code, error_message=None,
                                                              responses=())
