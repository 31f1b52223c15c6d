"""DescribeGroups (API 15), v0-v5: state, protocol and members of each group."""
from __future__ import annotations

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.DESCRIBE_GROUPS
_AUTHORIZED_OPERATIONS_OMITTED = -2147483648


def handle(broker, version: int, body) -> bytes:
    r = entities.decode_request(API_KEY, version, body)
    rb = entities.ResponseBuilder(API_KEY, version)
    out = []
    for gid in r.groups:
        g = broker.groups.groups.get(str(gid))
        members = ()
        if g is not None:
            members = tuple(rb("DescribedGroupMember", member_id=m.member_id, group_instance_id=m.instance_id,
                               client_id=m.client_id, client_host=m.client_host,
                               member_metadata=dict(m.protocols).get(g.protocol, b""),
                               member_assignment=m.assignment) for m in g.members.values())
        out.append(rb("DescribedGroup", error_code=ErrorCode.NONE, group_id=gid,
                      group_state=g.state if g else "Dead", protocol_type=(g.protocol_type or "") if g else "",
                      protocol_data=(g.protocol or "") if g else "", members=members,
                      authorized_operations=_AUTHORIZED_OPERATIONS_OMITTED))
    return rb.encode(throttle_time=0, groups=tuple(out))
