"""DescribeGroups (API 15), v0-v5: state, protocol and members of each classic group. Each group
needs DESCRIBE (else GROUP_AUTHORIZATION_FAILED in its entry); v3+ authorized operations are the
caller's. A KIP-848 consumer group is not a classic group: `Dead` without an error, as Kafka 4
answers below v6 (ConsumerGroupDescribe describes it)."""
from __future__ import annotations

from typing import Any

from oncelog.broker.security.authorization import GROUP, Op, authorize, authorized_operations
from oncelog.broker.services import BrokerServices
from oncelog.core.groups.classic_group import STABLE
from oncelog.core.security.authorizer import AUTHORIZED_OPERATIONS_OMITTED
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.DESCRIBE_GROUPS


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    asked = bool(getattr(r, "include_authorized_operations", False))
    out = []
    for gid in r.groups:
        if not authorize(broker, Op.DESCRIBE, GROUP, str(gid)):
            out.append(rb.error("DescribedGroup", ErrorCode.GROUP_AUTHORIZATION_FAILED, group_id=gid,
                                authorized_operations=AUTHORIZED_OPERATIONS_OMITTED))
            continue
        if not broker.coordinates(str(gid)):
            out.append(rb("DescribedGroup", error_code=ErrorCode.NOT_COORDINATOR, group_id=gid,
                          group_state="", protocol_type="", protocol_data="", members=(),
                          authorized_operations=AUTHORIZED_OPERATIONS_OMITTED))
            continue
        g = None if broker.groups.consumer.is_consumer_group(str(gid)) else broker.groups.group(str(gid))
        members: tuple[Any, ...] = ()
        # as Kafka: metadata and assignments only once the group is Stable
        stable = g is not None and g.state == STABLE
        if g is not None:
            members = tuple(rb("DescribedGroupMember", member_id=m.member_id, group_instance_id=m.instance_id,
                               client_id=m.client_id, client_host=m.client_host,
                               member_metadata=m.metadata(g.protocol) if stable else b"",
                               member_assignment=m.assignment if stable else b"")
                            for m in g.members.values())
        out.append(rb("DescribedGroup", error_code=ErrorCode.NONE, group_id=gid,
                      group_state=g.state if g else "Dead", protocol_type=(g.protocol_type or "") if g else "",
                      protocol_data=(g.protocol or "") if stable and g else "", members=members,
                      authorized_operations=authorized_operations(broker, GROUP, str(gid), asked)))
    return rb.encode(throttle_time=0, groups=tuple(out))


def error_response(version: int, request: Any, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode_error(code, groups=tuple(
        rb.error("DescribedGroup", code, group_id=gid, authorized_operations=AUTHORIZED_OPERATIONS_OMITTED)
        for gid in request.groups))
