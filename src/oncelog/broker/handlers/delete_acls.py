"""DeleteAcls (API 31), v1-v3: ALTER on the cluster, then forwarded to the controller, which
removes what each filter matches (Kafka's AclBindingFilter: ANY, MATCH; a filter that matches
nothing succeeds with an empty list). A filter with a code Kafka does not know fails the request's
parse (Kafka's DeleteAclsRequest.validate): the connection is closed with a log line."""
from __future__ import annotations

from typing import Any

from oncelog.broker.security.authorization import Op, require_authorizer, require_cluster
from oncelog.broker.services import BrokerServices
from oncelog.core.security.acl import filter_from_wire, validate_filter
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey

API_KEY = ApiKey.DELETE_ACLS
CONTROLLER_VERSION = 3


def decode(version: int, body: memoryview) -> Any:
    r = entities.decode_request(API_KEY, version, body)
    for f in r.filters:
        problem = validate_filter(filter_from_wire(f))
        if problem:
            raise ValueError(f"Filters contain UNKNOWN elements: {problem}")
    return r


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    require_authorizer(broker)
    require_cluster(broker, Op.ALTER)
    cls = entities.nested(API_KEY, CONTROLLER_VERSION, "request", "DeleteAclsFilter")
    filters = tuple(entities.make(cls, resource_type_filter=f.resource_type_filter,
                                  resource_name_filter=f.resource_name_filter,
                                  pattern_type_filter=f.pattern_type_filter, principal_filter=f.principal_filter,
                                  host_filter=f.host_filter, operation=f.operation, permission_type=f.permission_type)
                    for f in r.filters)
    answer = await broker.security.client.request(API_KEY, CONTROLLER_VERSION, filters=filters)
    await broker.security.catch_up()
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode(throttle_time=0, filter_results=tuple(
        rb("DeleteAclsFilterResult", error_code=f.error_code, error_message=f.error_message, matching_acls=tuple(
            rb("DeleteAclsMatchingAcl", error_code=m.error_code, error_message=m.error_message,
               resource_type=m.resource_type, resource_name=m.resource_name, pattern_type=m.pattern_type,
               principal=m.principal, host=m.host, operation=m.operation, permission_type=m.permission_type)
            for m in f.matching_acls))
        for f in answer.filter_results))


def error_response(version: int, r: Any, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode(throttle_time=0, filter_results=tuple(
        rb("DeleteAclsFilterResult", error_code=code, error_message=None, matching_acls=()) for _ in r.filters))
