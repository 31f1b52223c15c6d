"""ShareGroupDescribe (API 77), v1: a share group's state, epochs, assignor and members, each with
its epoch, client, subscription and assignment. A group that is not a share group is
GROUP_ID_NOT_FOUND. Each group needs DESCRIBE (GROUP_AUTHORIZATION_FAILED in its entry), and
DESCRIBE on every topic its members subscribe to (TOPIC_AUTHORIZATION_FAILED), as for consumer
groups."""
from __future__ import annotations

from typing import Any

from oncelog.broker.handlers.api_versions import share_groups_enabled
from oncelog.broker.security.authorization import GROUP, TOPIC, Op, authorize, authorized_names, authorized_operations
from oncelog.broker.services import BrokerServices
from oncelog.core.security.authorizer import AUTHORIZED_OPERATIONS_OMITTED
from oncelog.core.share.group import Assignment
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.SHARE_GROUP_DESCRIBE
E = ErrorCode
SIMPLE_ASSIGNOR = "simple"


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    asked = bool(r.include_authorized_operations)
    share = broker.groups.share

    def failed(gid: str, code: int, message: str | None = None) -> Any:
        return rb.error("DescribedGroup", code, group_id=gid, error_message=message, group_state="",
                        assignor_name="", authorized_operations=AUTHORIZED_OPERATIONS_OMITTED)

    def assignment(a: Assignment) -> Any:
        parts = []
        for tid, ps in sorted(a.items()):
            name = broker.logs.topic_name(tid)
            if name is not None and ps:
                parts.append(rb("TopicPartitions", topic_id=tid, topic_name=name, partitions=tuple(sorted(ps))))
        return rb("Assignment", topic_partitions=tuple(parts))

    out = []
    for gid in r.group_ids:
        group_id = str(gid)
        if not authorize(broker, Op.DESCRIBE, GROUP, group_id):
            out.append(failed(gid, E.GROUP_AUTHORIZATION_FAILED))
            continue
        if not share_groups_enabled(broker):
            out.append(failed(gid, E.UNSUPPORTED_VERSION, "Share groups are not enabled (share.version is 0)."))
            continue
        if not broker.coordinates(group_id):
            out.append(failed(gid, E.NOT_COORDINATOR))
            continue
        if not share.is_share_group(group_id):
            out.append(failed(gid, E.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a share group."))
            continue
        g = share.groups.get(group_id)
        members = sorted(g.members.values(), key=lambda m: m.member_id) if g is not None else []
        topics = {t for m in members for t in m.subscribed}
        if authorized_names(broker, Op.DESCRIBE, TOPIC, topics) != topics:
            out.append(failed(gid, E.TOPIC_AUTHORIZATION_FAILED, "The group has topics the caller may not describe."))
            continue
        out.append(rb("DescribedGroup", error_code=E.NONE, error_message=None, group_id=gid,
                      group_state=g.state if g is not None else "Empty",
                      group_epoch=g.epoch if g is not None else 0,
                      assignment_epoch=g.assignment_epoch if g is not None else 0, assignor_name=SIMPLE_ASSIGNOR,
                      members=tuple(rb("Member", member_id=m.member_id, rack_id=m.rack_id, member_epoch=m.epoch,
                                       client_id=m.client_id, client_host=m.client_host,
                                       subscribed_topic_names=m.subscribed, assignment=assignment(m.assignment))
                                    for m in members),
                      authorized_operations=authorized_operations(broker, GROUP, group_id, asked)))
    return rb.encode(throttle_time=0, groups=tuple(out))


def error_response(version: int, request: Any, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode_error(code, groups=tuple(
        rb.error("DescribedGroup", code, group_id=gid, group_state="", assignor_name="",
                 authorized_operations=AUTHORIZED_OPERATIONS_OMITTED)
        for gid in request.group_ids))
