"""LeaveGroup (API 13), v0-v4 (v3+ may remove several members)."""
from __future__ import annotations

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.LEAVE_GROUP


def handle(broker, version: int, body) -> bytes:
    r = entities.decode_request(API_KEY, version, body)
    rb = entities.ResponseBuilder(API_KEY, version)
    group = str(r.group_id)
    if not broker.coordinates(group):
        return rb.encode(throttle_time=0, error_code=ErrorCode.NOT_COORDINATOR, members=())
    if version < 3:
        return rb.encode(throttle_time=0, error_code=broker.groups.leave(group, r.member_id))
    members = tuple(rb("MemberResponse", member_id=m.member_id, group_instance_id=m.group_instance_id,
                       error_code=broker.groups.leave(group, m.member_id)) for m in r.members)
    return rb.encode(throttle_time=0, error_code=ErrorCode.NONE, members=members)
