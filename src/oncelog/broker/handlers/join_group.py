"""JoinGroup (API 11), v0-v7. From v4 a new dynamic member first gets MEMBER_ID_REQUIRED with its id
(KIP-394); from v5 a member may be static (`group.instance.id`, KIP-345). The answer waits for the
rebalance to complete. v0 has no rebalance timeout: the session timeout stands in for it.
Needs READ on the group (else GROUP_AUTHORIZATION_FAILED)."""
from __future__ import annotations

from typing import Any

from oncelog.broker.net.request_context import CLIENT
from oncelog.broker.security.authorization import GROUP, Op, require
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.JOIN_GROUP


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    client_id, host = CLIENT.get()
    require(broker, Op.READ, GROUP, str(r.group_id))
    rb = entities.ResponseBuilder(API_KEY, version)
    if not broker.coordinates(str(r.group_id)):
        return rb.encode(throttle_time=0, error_code=ErrorCode.NOT_COORDINATOR, generation_id=-1,
                         protocol_type=None, protocol_name="", leader="", member_id=r.member_id, members=())
    session_ms = entities.millis(r.session_timeout)
    rebalance_ms = entities.millis(getattr(r, "rebalance_timeout", r.session_timeout))
    result = await broker.groups.join(
        str(r.group_id), r.member_id, getattr(r, "group_instance_id", None), client_id or "", host,
        r.protocol_type, [(p.name, bytes(p.metadata)) for p in r.protocols], session_ms, rebalance_ms,
        require_known_member=version >= 4)
    members = tuple(rb("JoinGroupResponseMember", member_id=mid, group_instance_id=iid, metadata=meta)
                    for mid, iid, meta in result.members)
    return rb.encode(throttle_time=0, error_code=result.error, generation_id=result.generation,
                     protocol_type=result.protocol_type, protocol_name=result.protocol or "",
                     leader=result.leader, member_id=result.member_id, members=members)
