"""DescribeAcls (API 29), v1-v3: DESCRIBE on the cluster; answered from the broker's copy of the
controller's ACLs, grouped by resource pattern as Kafka groups them. A filter that matches
nothing answers no resources. A filter with a code Kafka does not know fails the request's parse
(Kafka's DescribeAclsRequest.validate): the connection is closed with a log line."""
from __future__ import annotations

from itertools import groupby
from typing import Any

from oncelog.broker.security.authorization import Op, require_cluster
from oncelog.broker.services import BrokerServices
from oncelog.core.security.acl import filter_from_wire, validate_filter
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.DESCRIBE_ACLS


def decode(version: int, body: memoryview) -> Any:
    r = entities.decode_request(API_KEY, version, body)
    problem = validate_filter(filter_from_wire(r))
    if problem:
        raise ValueError(f"DescribeAclsRequest contains UNKNOWN elements: {problem}")
    return r


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    if broker.authorizer is None:
        return rb.encode(throttle_time=0, error_code=ErrorCode.SECURITY_DISABLED,
                         error_message="No Authorizer is configured.", resources=())
    require_cluster(broker, Op.DESCRIBE)
    bindings = sorted(broker.authorizer.acls.bindings(filter_from_wire(r)),
                      key=lambda b: (b.pattern.resource_type, b.pattern.pattern_type, b.pattern.name))
    resources = []
    for pattern, group in groupby(bindings, key=lambda b: b.pattern):
        resources.append(rb("DescribeAclsResource", resource_type=pattern.resource_type, resource_name=pattern.name,
                            pattern_type=pattern.pattern_type, acls=tuple(
                                rb("AclDescription", principal=b.entry.principal, host=b.entry.host,
                                   operation=b.entry.operation, permission_type=b.entry.permission_type)
                                for b in group)))
    return rb.encode(throttle_time=0, error_code=ErrorCode.NONE, error_message=None, resources=tuple(resources))
