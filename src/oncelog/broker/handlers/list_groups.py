"""ListGroups (API 16), v0-v5: every group with DESCRIBE on the cluster, else those the caller may
DESCRIBE (Kafka filters silently). v4 filters by state, v5 by type and answers each group's type
(`classic` or `consumer`; filters ignore case, as Kafka's)."""
from __future__ import annotations

from typing import Any

from oncelog.broker.security.authorization import GROUP, Op, authorize, authorize_cluster
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.LIST_GROUPS


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    states = {s.lower() for s in getattr(r, "states_filter", ()) or ()}  # Kafka ignores case
    types = {t.lower() for t in getattr(r, "types_filter", ()) or ()}
    everything = authorize_cluster(broker, Op.DESCRIBE, audit=False)
    groups = tuple(rb("ListedGroup", group_id=gid, protocol_type=ptype, group_state=state, group_type=gtype)
                   for gid, ptype, state, gtype in broker.groups.listing()
                   if broker.coordinates(gid) and (not states or state.lower() in states)
                   and (not types or gtype in types)
                   and (everything or authorize(broker, Op.DESCRIBE, GROUP, gid, audit=False)))
    return rb.encode(throttle_time=0, error_code=ErrorCode.NONE, groups=groups)
