"""DeleteGroups (API 42), v0-v2: an empty group is forgotten with its committed offsets; a group
with members answers NON_EMPTY_GROUP, an unknown one GROUP_ID_NOT_FOUND (Kafka's rules). Each group needs DELETE (else
GROUP_AUTHORIZATION_FAILED)."""
from __future__ import annotations

from typing import Any

from oncelog.broker.security.authorization import GROUP, Op, authorize
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.DELETE_GROUPS


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    results = tuple(
        rb("DeletableGroupResult", group_id=gid,
           error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED if not authorize(broker, Op.DELETE, GROUP, str(gid))
           else broker.groups.delete_group(str(gid)) if broker.coordinates(str(gid))
           else ErrorCode.NOT_COORDINATOR)
        for gid in r.groups_names)
    return rb.encode(throttle_time=0, results=results)


def error_response(version: int, request: Any, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode_error(code, results=tuple(rb.error("DeletableGroupResult", code, group_id=gid)
                                               for gid in request.groups_names))
