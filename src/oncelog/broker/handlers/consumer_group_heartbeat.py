"""ConsumerGroupHeartbeat (API 68), v0-v1 (KIP-848; librdkafka sends v1 only): a member of a
consumer group joins (epoch 0), reports what it owns, learns its epoch and the partitions it may
use now, and leaves (epoch -1, or -2 for a static member coming back). Decided by
`core.groups.heartbeat`, stored and timed by `broker.groups.consumer_groups`. v0 lets the server name a
joining member; from v1 the member id is the client's (KIP-1082).

Refused as Kafka refuses: UNSUPPORTED_VERSION when `consumer` is not in
`group.coordinator.rebalance.protocols`; READ on the group (GROUP_AUTHORIZATION_FAILED) and
DESCRIBE on every topic named in the subscription (TOPIC_AUTHORIZATION_FAILED, for the whole
heartbeat); a regex matches only topics every member using it may DESCRIBE (the coordinator keeps
each member's rights, `authorization.topic_visibility`); NOT_COORDINATOR on another broker's
group. Every answer says how often to heartbeat.
"""
from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

from oncelog.broker.net.request_context import CLIENT
from oncelog.broker.security.authorization import GROUP, TOPIC, Op, authorized_names, require, topic_visibility
from oncelog.broker.services import BrokerServices
from oncelog.core.groups.heartbeat import Heartbeat
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.CONSUMER_GROUP_HEARTBEAT
E = ErrorCode


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    interval = broker.groups.consumer.config.heartbeat_interval_ms

    def refuse(code: int, message: str | None = None) -> bytes:
        return rb.encode(throttle_time=0, error_code=code, error_message=message, member_id=None,
                         member_epoch=-1, heartbeat_interval=0, assignment=None)

    if not broker.groups.consumer.config.enabled:
        return refuse(E.UNSUPPORTED_VERSION, "The consumer group protocol is not enabled on this broker "
                                             "(group.coordinator.rebalance.protocols).")
    group = str(r.group_id)
    require(broker, Op.READ, GROUP, group)
    names = tuple(str(t) for t in r.subscribed_topic_names) if r.subscribed_topic_names is not None else None
    if names and authorized_names(broker, Op.DESCRIBE, TOPIC, names) != set(names):
        return refuse(E.TOPIC_AUTHORIZATION_FAILED, "The member may not describe every topic it subscribes to.")
    if not broker.coordinates(group):
        return refuse(E.NOT_COORDINATOR)
    if broker.groups.share.is_share_group(group):   # one group id names one group of one type
        return refuse(E.GROUP_ID_NOT_FOUND, f"Group {group} is a share group.")
    owned: dict[uuid.UUID, frozenset[int]] | None = None
    if r.topic_partitions is not None:
        owned = {}
        for t in r.topic_partitions:
            if t.topic_id is not None:
                owned[t.topic_id] = owned.get(t.topic_id, frozenset()) | frozenset(int(p) for p in t.partitions)
    client_id, host = CLIENT.get()
    rq = Heartbeat(group, str(r.member_id), int(r.member_epoch), r.instance_id, r.rack_id,
                   entities.millis(r.rebalance_timeout), names, getattr(r, "subscribed_topic_regex", None),
                   r.server_assignor, owned, client_id or "", host)
    if version == 0 and not rq.member_id and rq.member_epoch == 0:  # v0: the server names a new member
        rq = replace(rq, member_id=str(uuid.uuid4()))
    outcome = await broker.groups.consumer.heartbeat_durably(rq, version, topic_visibility(broker))
    if outcome.error:
        return refuse(outcome.error, outcome.message)
    answer = outcome.answer
    assert answer is not None  # an outcome without an error carries its answer
    assignment = None
    if answer.assignment is not None:
        assignment = rb("Assignment", topic_partitions=tuple(
            rb("TopicPartitions", topic_id=tid, partitions=tuple(sorted(ps)))
            for tid, ps in sorted(answer.assignment.items()) if ps))
    return rb.encode(throttle_time=0, error_code=E.NONE, error_message=None, member_id=answer.member_id,
                     member_epoch=answer.member_epoch, heartbeat_interval=interval, assignment=assignment)
