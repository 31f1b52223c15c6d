"""AlterClientQuotas (API 49), v0-v1: ALTER_CONFIGS on the cluster, then forwarded to the
controller, which validates each entity (INVALID_REQUEST with Kafka's messages), appends and
fsyncs (unless validate_only); the broker applies the records before it answers."""
from __future__ import annotations

from typing import Any

from oncelog.broker.security.authorization import Op, authorize_cluster
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.ALTER_CLIENT_QUOTAS
CONTROLLER_VERSION = 1


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    if not authorize_cluster(broker, Op.ALTER_CONFIGS):
        return error_response(version, r, ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    q = entities.RequestBuilder(API_KEY, CONTROLLER_VERSION)
    entries = tuple(q("EntryData", entity=tuple(q("EntityData", entity_type=e.entity_type, entity_name=e.entity_name)
                                                for e in entry.entity),
                      ops=tuple(q("OpData", key=o.key, value=o.value, remove=o.remove) for o in entry.ops))
                    for entry in r.entries)
    answer = await broker.security.client.request(API_KEY, CONTROLLER_VERSION, entries=entries,
                                                  validate_only=r.validate_only)
    await broker.security.catch_up()
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode(throttle_time=0, entries=tuple(
        rb("EntryData", error_code=a.error_code, error_message=a.error_message, entity=tuple(
            rb("EntityData", entity_type=e.entity_type, entity_name=e.entity_name) for e in a.entity))
        for a in answer.entries))


def error_response(version: int, r: Any, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode(throttle_time=0, entries=tuple(
        rb("EntryData", error_code=code, error_message=None, entity=tuple(
            rb("EntityData", entity_type=e.entity_type, entity_name=e.entity_name) for e in entry.entity))
        for entry in r.entries))
