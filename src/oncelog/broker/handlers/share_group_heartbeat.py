"""ShareGroupHeartbeat (API 76), v1 (KIP-932; librdkafka 2.16 sends v1): a member of a share group
joins (epoch 0, with its client-chosen member id and subscription), heartbeats with the epoch it
was last told, and leaves (epoch -1). Decided by `core.share.group`, kept and timed by
`broker.groups.share_groups`. The answer carries the member's assignment when it changed, and how
often to heartbeat (`group.share.heartbeat.interval.ms`).

Refused as Kafka refuses: UNSUPPORTED_VERSION while share groups are disabled (`share.version` 0);
READ on the group (GROUP_AUTHORIZATION_FAILED) and DESCRIBE on every topic subscribed
(TOPIC_AUTHORIZATION_FAILED); NOT_COORDINATOR on another broker's group; a group id used by a
classic or consumer group with members is GROUP_ID_NOT_FOUND (Kafka's answer for a group of
another type).
"""
from __future__ import annotations

from typing import Any

from oncelog.broker.handlers.api_versions import share_groups_enabled
from oncelog.broker.net.request_context import CLIENT
from oncelog.broker.security.authorization import GROUP, TOPIC, Op, authorized_names, require
from oncelog.broker.services import BrokerServices
from oncelog.core.share.group import ShareHeartbeat
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

API_KEY = ApiKey.SHARE_GROUP_HEARTBEAT
E = ErrorCode


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    share = broker.groups.share

    def refuse(code: int, message: str | None = None) -> bytes:
        return rb.encode(throttle_time=0, error_code=code, error_message=message, member_id=None,
                         member_epoch=-1, heartbeat_interval=0, assignment=None)

    if not share_groups_enabled(broker):
        return refuse(E.UNSUPPORTED_VERSION, "Share groups are not enabled (share.version is 0).")
    group = str(r.group_id)
    require(broker, Op.READ, GROUP, group)
    names = tuple(str(t) for t in r.subscribed_topic_names) if r.subscribed_topic_names is not None else None
    if names and authorized_names(broker, Op.DESCRIBE, TOPIC, names) != set(names):
        return refuse(E.TOPIC_AUTHORIZATION_FAILED, "The member may not describe every topic it subscribes to.")
    if not broker.coordinates(group):
        return refuse(E.NOT_COORDINATOR)
    if not share.is_share_group(group) and not broker.groups.free_for_share(group):
        return refuse(E.GROUP_ID_NOT_FOUND, f"Group {group} is not a share group.")
    client_id, host = CLIENT.get()
    rq = ShareHeartbeat(group, str(r.member_id), int(r.member_epoch), r.rack_id, names, client_id or "", host)
    try:
        answer = share.heartbeat(rq)
    except KafkaProtocolError as e:
        return refuse(e.code, str(e) or None)
    assignment = None
    if answer.assignment is not None:
        assignment = rb("Assignment", topic_partitions=tuple(
            rb("TopicPartitions", topic_id=tid, partitions=tuple(sorted(ps)))
            for tid, ps in sorted(answer.assignment.items()) if ps))
    return rb.encode(throttle_time=0, error_code=E.NONE, error_message=None, member_id=answer.member_id,
                     member_epoch=answer.member_epoch, heartbeat_interval=share.config.heartbeat_interval_ms,
                     assignment=assignment)
