"""Heartbeat (API 12), v0-v4."""
from __future__ import annotations

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.HEARTBEAT


def handle(broker, version: int, body) -> bytes:
    r = entities.decode_request(API_KEY, version, body)
    error = (broker.groups.heartbeat(str(r.group_id), int(r.generation_id), r.member_id)
             if broker.coordinates(str(r.group_id)) else ErrorCode.NOT_COORDINATOR)
    return entities.ResponseBuilder(API_KEY, version).encode(throttle_time=0, error_code=error)
