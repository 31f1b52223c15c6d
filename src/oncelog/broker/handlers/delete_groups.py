"""DeleteGroups (API 42), v0-v2: an empty group is forgotten with its committed offsets; a group
with members answers NON_EMPTY_GROUP, an unknown one GROUP_ID_NOT_FOUND (Kafka's rules)."""
from __future__ import annotations

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.DELETE_GROUPS


def handle(broker, version: int, body) -> bytes:
    r = entities.decode_request(API_KEY, version, body)
    rb = entities.ResponseBuilder(API_KEY, version)
    results = tuple(
        rb("DeletableGroupResult", group_id=gid,
           error_code=broker.groups.delete_group(str(gid)) if broker.coordinates(str(gid))
           else ErrorCode.NOT_COORDINATOR)
        for gid in r.groups_names)
    return rb.encode(throttle_time=0, results=results)
