"""AlterShareGroupOffsets (API 91), v0 (kafka-share-groups.sh --reset-offsets,
Admin.alterShareGroupOffsets): set the start offset of share-partitions of a share group that has
no members (NON_EMPTY_GROUP otherwise). Each share-partition named starts again at its offset with
nothing in flight, at a new state epoch (Kafka's InitializeShareGroupState), written through the
group's state log like any change of its state (`broker.groups.share_groups`: one group commit,
one fsync) and answered once durable, so the next share consumer starts there after a restart or
a kill -9 too. Start offset -1 is Kafka's "uninitialized": the share-partition's state goes, and
its next ShareFetch initializes it at `share.auto.offset.reset`; below -1 is INVALID_REQUEST.

As Kafka: READ on the group (GROUP_AUTHORIZATION_FAILED, the whole answer), READ on each topic
(TOPIC_AUTHORIZATION_FAILED for its partitions), an unknown topic or partition
UNKNOWN_TOPIC_OR_PARTITION; the group's own errors answer at the top level without topics:
UNSUPPORTED_VERSION while `share.version` is 0, NOT_COORDINATOR on a broker without the group's
lease (and when the lease is lost before the write is durable), GROUP_ID_NOT_FOUND for the id of
a classic or consumer group, NON_EMPTY_GROUP; an id no group has is a new share group. A write
that fails answers KAFKA_STORAGE_ERROR for the partitions it carried.

Bounded per request: a partition named twice is altered once (its other entries INVALID_REQUEST),
so a request writes at most one state per existing partition of the topics it names."""
from __future__ import annotations

import functools
import uuid
from typing import Any

from oncelog.broker.handlers.api_versions import share_groups_enabled
from oncelog.broker.security.authorization import GROUP, TOPIC, Op, authorize, authorized_names
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode
from oncelog.storage.fence import Fenced
from oncelog.storage.share_state import StaleStateEpoch

API_KEY = ApiKey.ALTER_SHARE_GROUP_OFFSETS
E = ErrorCode
UNINITIALIZED = -1


NO_TOPIC_ID = uuid.UUID(int=0)


def refusal(broker: BrokerServices, operation: Op, group: str) -> tuple[int, str | None] | None:
    """The whole answer's error of an Alter or DeleteShareGroupOffsets before any topic is looked
    at: share groups off, `operation` on the group refused, or an empty group id."""
    if not share_groups_enabled(broker):
        return E.UNSUPPORTED_VERSION, "Share groups are not enabled (share.version is 0)."
    if not authorize(broker, operation, GROUP, group):
        return E.GROUP_AUTHORIZATION_FAILED, None
    if not group:
        return E.INVALID_GROUP_ID, "The group id is empty."
    return None


def whole_answer(rb: entities.ResponseBuilder, code: int, message: str | None = None) -> bytes:
    """An Alter or DeleteShareGroupOffsets answer without topics: `code` for the whole request."""
    return rb.encode(throttle_time=0, error_code=code, error_message=message, responses=())


async def stored(share: Any, group: str, write: int) -> tuple[int, str] | None:
    """The group's share-state changes up to `write` (0: none) flushed and made durable: None,
    or why not: NOT_COORDINATOR for the whole answer when the fence or a newer state epoch refused
    them (another broker holds the group now), else KAFKA_STORAGE_ERROR for what was changed."""
    if not write:
        return None
    share.flush(group)
    error = await share.durable(group, write)
    if error is None:
        return None
    why = f"the share group's state was not written: {error}"
    if isinstance(error, (Fenced, StaleStateEpoch)):
        return E.NOT_COORDINATOR, why
    return E.KAFKA_STORAGE_ERROR, why


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    share = broker.groups.share
    group = str(r.group_id or "")

    top = functools.partial(whole_answer, rb)

    refused = refusal(broker, Op.READ, group)
    if refused is not None:
        return top(*refused)
    readable = authorized_names(broker, Op.READ, TOPIC, (str(t.topic_name) for t in r.topics))
    # (topic, partition) -> [code, message]; the partitions to write, in the request's order
    answers: dict[str, dict[int, list[Any]]] = {}
    wanted: list[tuple[str, int, int]] = []
    repeated: dict[str, list[int]] = {}   # named twice: INVALID_REQUEST for the repeats
    for t in r.topics:
        name = str(t.topic_name)
        info = broker.logs.topics.get(name) if name in readable else None
        out = answers.setdefault(name, {})
        for p in t.partitions:
            index, offset = int(p.partition_index), int(p.start_offset)
            if index in out:
                repeated.setdefault(name, []).append(index)
            elif name not in readable:
                out[index] = [E.TOPIC_AUTHORIZATION_FAILED, None]
            elif info is None or not 0 <= index < info.partitions:
                out[index] = [E.UNKNOWN_TOPIC_OR_PARTITION, None]
            elif offset < UNINITIALIZED:
                out[index] = [E.INVALID_REQUEST, f"start offset {offset} is below -1"]
            else:
                out[index] = [E.NONE, None]
                wanted.append((name, index, offset))
    if not broker.coordinates(group):
        return top(E.NOT_COORDINATOR)
    if not share.is_share_group(group) and not broker.groups.free_for_share(group):
        return top(E.GROUP_ID_NOT_FOUND, f"Group {group} is not a share group.")
    if not share.is_empty(group):
        return top(E.NON_EMPTY_GROUP, f"Share group {group} has members: stop them before altering its offsets.")
    write = 0
    initialized = share.initialized(group) if any(o == UNINITIALIZED for _n, _p, o in wanted) else set()
    for name, index, offset in wanted:
        tid = broker.logs.topics[name].topic_id
        if offset != UNINITIALIZED:
            write = max(write, share.reset(group, tid, index, offset))
        elif (tid, index) in initialized:
            write = max(write, share.drop(group, tid, index))
    failed = await stored(share, group, write)
    if failed is not None:
        if failed[0] == E.NOT_COORDINATOR:
            return top(*failed)
        for name, index, _offset in wanted:
            answers[name][index] = list(failed)
    topics = []
    for name, parts in answers.items():
        info = broker.logs.topics.get(name)
        rows = [rb("AlterShareGroupOffsetsResponsePartition", partition_index=p, error_code=code, error_message=msg)
                for p, (code, msg) in parts.items()]
        rows += [rb("AlterShareGroupOffsetsResponsePartition", partition_index=p, error_code=E.INVALID_REQUEST,
                    error_message=f"{name}-{p} is named more than once.") for p in repeated.get(name, ())]
        topics.append(rb("AlterShareGroupOffsetsResponseTopic", topic_name=name,
                         topic_id=info.topic_id if info is not None and name in readable else NO_TOPIC_ID,
                         partitions=tuple(rows)))
    return rb.encode(throttle_time=0, error_code=E.NONE, error_message=None, responses=tuple(topics))


def error_response(version: int, request: Any, code: int) -> bytes:
    return entities.ResponseBuilder(API_KEY, version).encode(throttle_time=0, error_code=code, error_message=None,
                                                              responses=())
