"""Heartbeat (API 12), v0-v4 (v3+ names the static instance). Answers as Kafka does per state:
REBALANCE_IN_PROGRESS while the group prepares a rebalance (the member commits, then rejoins),
NONE in CompletingRebalance and Stable, ILLEGAL_GENERATION for another generation. Needs READ on the group."""
from __future__ import annotations

from typing import Any

from oncelog.broker.security.authorization import GROUP, Op, require
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.HEARTBEAT


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    require(broker, Op.READ, GROUP, str(r.group_id))
    error = (broker.groups.heartbeat(str(r.group_id), int(r.generation_id), r.member_id,
                                     getattr(r, "group_instance_id", None))
             if broker.coordinates(str(r.group_id)) else ErrorCode.NOT_COORDINATOR)
    return entities.ResponseBuilder(API_KEY, version).encode(throttle_time=0, error_code=error)
