"""OffsetDelete (API 47), v0: a group's committed offsets for partitions it does not consume
(Kafka's rules, `GroupCoordinator.delete_offsets`); a partition the cluster does not have is
UNKNOWN_TOPIC_OR_PARTITION, a group-wide refusal (GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP,
NOT_COORDINATOR) the top-level error with no topics, as Kafka answers it. Needs DELETE on the
group (GROUP_AUTHORIZATION_FAILED) and READ on each topic (TOPIC_AUTHORIZATION_FAILED)."""
from __future__ import annotations

from typing import Any

from oncelog.broker.security.authorization import GROUP, TOPIC, Op, authorized_names, require
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

API_KEY = ApiKey.OFFSET_DELETE


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    group_id = str(r.group_id)
    if not group_id:
        raise KafkaProtocolError(ErrorCode.INVALID_GROUP_ID, "empty group id")
    require(broker, Op.DELETE, GROUP, group_id)
    readable = authorized_names(broker, Op.READ, TOPIC, (str(t.name) for t in r.topics))
    if not broker.coordinates(group_id):
        raise KafkaProtocolError(ErrorCode.NOT_COORDINATOR, f"group {group_id!r} is coordinated elsewhere")
    errors: dict[tuple[str, int], int] = {}
    known = []
    for t in r.topics:
        info = broker.logs.topics.get(str(t.name))
        for p in t.partitions:
            tp = (str(t.name), int(p.partition_index))
            if tp[0] not in readable:
                errors[tp] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif info is None or not 0 <= tp[1] < info.partitions:
                errors[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                known.append(tp)
    group_error, group_errors = broker.groups.delete_offsets(group_id, known)
    if group_error:
        raise KafkaProtocolError(ErrorCode(group_error), f"group {group_id!r}")
    errors.update(group_errors)
    topics = tuple(
        rb("OffsetDeleteResponseTopic", name=t.name, partitions=tuple(
            rb("OffsetDeleteResponsePartition", partition_index=p.partition_index,
               error_code=errors[(str(t.name), int(p.partition_index))])
            for p in t.partitions))
        for t in r.topics)
    return rb.encode(error_code=ErrorCode.NONE, throttle_time=0, topics=topics)


def error_response(version: int, request: Any, code: int) -> bytes:
    return entities.ResponseBuilder(API_KEY, version).encode_error(code, topics=())
