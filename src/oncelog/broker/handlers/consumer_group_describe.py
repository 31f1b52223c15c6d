"""ConsumerGroupDescribe (API 69), v0-v1: a consumer group's state, epochs, assignor and members,
each with its epoch, subscription, current and target assignment (v1: the member's type, 1 for
the consumer protocol). A group that is not a consumer group (unknown, or classic) is
GROUP_ID_NOT_FOUND, which is how librdkafka's AdminClient knows to ask DescribeGroups instead.
Each group needs DESCRIBE (GROUP_AUTHORIZATION_FAILED in its entry), and DESCRIBE on every topic
its members subscribe to or are assigned (TOPIC_AUTHORIZATION_FAILED, Kafka 4's rule).

Bounded per request (issue 36): a group id repeated in one request is described once, its other
entries INVALID_REQUEST (so an answer is as large as the distinct groups asked for, each built
by its members' heartbeats), and other clients are served between two groups."""
from __future__ import annotations

import asyncio
from typing import Any

from oncelog.broker.security.authorization import GROUP, TOPIC, Op, authorize, authorized_names, authorized_operations
from oncelog.broker.services import BrokerServices
from oncelog.core.groups.reconciliation import Assignment
from oncelog.core.security.authorizer import AUTHORIZED_OPERATIONS_OMITTED
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.CONSUMER_GROUP_DESCRIBE
E = ErrorCode
CONSUMER_MEMBER = 1


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    asked = bool(r.include_authorized_operations)
    coordinator = broker.groups.consumer

    def failed(gid: str, code: int, message: str | None = None) -> Any:
        return rb.error("DescribedGroup", code, group_id=gid, error_message=message, group_state="",
                        assignor_name="", authorized_operations=AUTHORIZED_OPERATIONS_OMITTED)

    def assignment(a: Assignment) -> Any:
        parts = []
        for tid, ps in sorted(a.items()):
            name = broker.logs.topic_name(tid)
            if name is not None and ps:  # a deleted topic is left out, as Kafka does
                parts.append(rb("TopicPartitions", topic_id=tid, topic_name=name, partitions=tuple(sorted(ps))))
        return rb("Assignment", topic_partitions=tuple(parts))

    out = []
    seen: set[str] = set()
    for gid in r.group_ids:
        group_id = str(gid)
        if group_id in seen:
            # Kafka answers a group asked for twice twice: one request repeating a group of
            # thousands of members made an answer of gigabytes, built and encoded on the event
            # loop. As Kafka's CreateTopics and ListOffsets answer a duplicate, INVALID_REQUEST.
            out.append(failed(gid, E.INVALID_REQUEST, f"Group {group_id} is asked for more than once."))
            continue
        seen.add(group_id)
        if out:
            await asyncio.sleep(0)   # other clients' requests are served between two groups
        if not authorize(broker, Op.DESCRIBE, GROUP, group_id):
            out.append(failed(gid, E.GROUP_AUTHORIZATION_FAILED))
            continue
        if not coordinator.config.enabled:
            out.append(failed(gid, E.UNSUPPORTED_VERSION, "The consumer group protocol is not enabled."))
            continue
        if not broker.coordinates(group_id):
            out.append(failed(gid, E.NOT_COORDINATOR))
            continue
        g = coordinator.group(group_id)
        if g is None:
            out.append(failed(gid, E.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a consumer group."))
            continue
        topics = set(g.subscribed_names()) | {n for m in g.members.values() for tid in m.assigned
                                              if (n := broker.logs.topic_name(tid)) is not None}
        if authorized_names(broker, Op.DESCRIBE, TOPIC, topics) != topics:
            out.append(failed(gid, E.TOPIC_AUTHORIZATION_FAILED, "The group has topics the caller may not describe."))
            continue
        members = tuple(rb("Member", member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id,
                           member_epoch=m.member_epoch, client_id=m.client_id, client_host=m.client_host,
                           subscribed_topic_names=m.subscribed_topic_names,
                           subscribed_topic_regex=m.subscribed_topic_regex, assignment=assignment(m.assigned),
                           target_assignment=assignment(g.target.get(m.member_id, {})),
                           member_type=CONSUMER_MEMBER)
                        for _mid, m in sorted(g.members.items()))
        out.append(rb("DescribedGroup", error_code=E.NONE, error_message=None, group_id=gid, group_state=g.state,
                      group_epoch=g.group_epoch, assignment_epoch=g.assignment_epoch,
                      assignor_name=g.preferred_assignor(coordinator.config.settings.assignors[0]),
                      members=members, authorized_operations=authorized_operations(broker, GROUP, group_id, asked)))
    return rb.encode(throttle_time=0, groups=tuple(out))


def error_response(version: int, request: Any, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode_error(code, groups=tuple(
        rb.error("DescribedGroup", code, group_id=gid, group_state="", assignor_name="",
                 authorized_operations=AUTHORIZED_OPERATIONS_OMITTED)
        for gid in request.group_ids))
