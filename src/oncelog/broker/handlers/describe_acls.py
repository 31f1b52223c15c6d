"""DescribeAcls (API 29), v1-v3: DESCRIBE on the cluster; answered from the broker's copy of the
controller's ACLs, grouped by resource pattern as Kafka groups them. A filter that matches
nothing answers no resources; one with an unknown enum code INVALID_REQUEST."""
from __future__ import annotations

from itertools import groupby

from oncelog.broker.authorization import Op, require_cluster
from oncelog.core.security.acl import filter_from_wire, validate_filter
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.DESCRIBE_ACLS


async def handle(broker, version: int, r) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    if broker.authorizer is None:
        return rb.encode(throttle_time=0, error_code=ErrorCode.SECURITY_DISABLED,
                         error_message="No Authorizer is configured.", resources=())
    require_cluster(broker, Op.DESCRIBE)
    f = filter_from_wire(r)
    problem = validate_filter(f)
    if problem:
        return rb.encode(throttle_time=0, error_code=ErrorCode.INVALID_REQUEST, error_message=problem, resources=())
    bindings = sorted(broker.authorizer.acls.bindings(f),
                      key=lambda b: (b.pattern.resource_type, b.pattern.pattern_type, b.pattern.name))
    resources = []
    for pattern, group in groupby(bindings, key=lambda b: b.pattern):
        resources.append(rb("DescribeAclsResource", resource_type=pattern.resource_type, resource_name=pattern.name,
                            pattern_type=pattern.pattern_type, acls=tuple(
                                rb("AclDescription", principal=b.entry.principal, host=b.entry.host,
                                   operation=b.entry.operation, permission_type=b.entry.permission_type)
                                for b in group)))
    return rb.encode(throttle_time=0, error_code=ErrorCode.NONE, error_message=None, resources=tuple(resources))
