"""SyncGroup (API 14), v0-v5: the leader hands in the assignment; followers wait for it. v3+ names
the static instance (fenced if another member took it over); v5 names protocol type and name,
which must match the group's. Needs READ on the group."""
from __future__ import annotations

from typing import Any

from oncelog.broker.security.authorization import GROUP, Op, require
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.SYNC_GROUP


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    require(broker, Op.READ, GROUP, str(r.group_id))
    if not broker.coordinates(str(r.group_id)):
        return entities.ResponseBuilder(API_KEY, version).encode(
            throttle_time=0, error_code=ErrorCode.NOT_COORDINATOR, protocol_type=None, protocol_name=None,
            assignment=b"")
    error, ptype, protocol, assignment = await broker.groups.sync(
        str(r.group_id), int(r.generation_id), r.member_id,
        {a.member_id: bytes(a.assignment) for a in r.assignments},
        getattr(r, "group_instance_id", None), getattr(r, "protocol_type", None),
        getattr(r, "protocol_name", None))
    return entities.ResponseBuilder(API_KEY, version).encode(
        throttle_time=0, error_code=error, protocol_type=ptype, protocol_name=protocol,
        assignment=assignment)
