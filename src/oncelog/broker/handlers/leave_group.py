"""LeaveGroup (API 13), v0-v4. v3+ removes a batch of members, each by member id or, with an empty
member id, by its static instance id (KIP-345's administrative removal); each gets its own error.
Needs READ on the group."""
from __future__ import annotations

from typing import Any

from oncelog.broker.security.authorization import GROUP, Op, require
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.LEAVE_GROUP


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    group = str(r.group_id)
    error: int = ErrorCode.NONE
    if group:
        require(broker, Op.READ, GROUP, group)
    if not group:
        error = ErrorCode.INVALID_GROUP_ID
    elif not broker.coordinates(group):
        error = ErrorCode.NOT_COORDINATOR
    if version < 3:
        if not error:
            error = broker.groups.leave(group, [(r.member_id, None)])[0]
        return rb.encode(throttle_time=0, error_code=error)
    if error:
        return rb.encode(throttle_time=0, error_code=error, members=())
    errors = broker.groups.leave(group, [(m.member_id, m.group_instance_id) for m in r.members])
    members = tuple(rb("MemberResponse", member_id=m.member_id, group_instance_id=m.group_instance_id,
                       error_code=e) for m, e in zip(r.members, errors))
    return rb.encode(throttle_time=0, error_code=ErrorCode.NONE, members=members)
