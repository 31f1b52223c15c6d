"""DescribeClientQuotas (API 48), v0-v1: DESCRIBE_CONFIGS on the cluster; answered from the
broker's copy of the controller's quota settings (`ClientQuotaStore.describe`)."""
from __future__ import annotations

from typing import Any

from oncelog.broker.security.authorization import Op, authorize_cluster
from oncelog.broker.services import BrokerServices
from oncelog.core.security.quotas import FilterComponent
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.DESCRIBE_CLIENT_QUOTAS


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    if not authorize_cluster(broker, Op.DESCRIBE_CONFIGS):
        return rb.encode(throttle_time=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                         error_message=None, entries=None)
    code, message, found = broker.security.state.quotas.describe(
        [FilterComponent(str(c.entity_type), int(c.match_type), c.match) for c in r.components], bool(r.strict))
    if code:
        return rb.encode(throttle_time=0, error_code=code, error_message=message, entries=None)
    return rb.encode(throttle_time=0, error_code=ErrorCode.NONE, error_message=None, entries=tuple(
        rb("EntryData", entity=tuple(rb("EntityData", entity_type=k, entity_name=n) for k, n in entity.parts().items()),
           values=tuple(rb("ValueData", key=k, value=v) for k, v in sorted(values.items())))
        for entity, values in found))
