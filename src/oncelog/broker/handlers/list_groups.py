"""ListGroups (API 16), v0-v4."""
from __future__ import annotations

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.LIST_GROUPS


async def handle(broker, version: int, r) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    states = {s.lower() for s in getattr(r, "states_filter", ()) or ()}  # Kafka ignores case
    groups = tuple(rb("ListedGroup", group_id=gid, protocol_type=ptype, group_state=state)
                   for gid, ptype, state in broker.groups.listing()
                   if broker.coordinates(gid) and (not states or state.lower() in states))
    return rb.encode(throttle_time=0, error_code=ErrorCode.NONE, groups=groups)
