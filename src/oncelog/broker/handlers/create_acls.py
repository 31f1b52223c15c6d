"""CreateAcls (API 30), v1-v3: ALTER on the cluster, then forwarded to the controller, which
validates each binding (INVALID_REQUEST with Kafka's message), appends and fsyncs the records;
the broker applies them before it answers, so the client's next request sees them.

A binding with a code Kafka does not know (its UNKNOWN) fails the request's parse, as Kafka's
CreateAclsRequest.validate makes it fail: the connection is closed with a log line. ANY where a
binding needs a value is INVALID_REQUEST for that binding ("Invalid resourceType ANY")."""
from __future__ import annotations

from typing import Any

from oncelog.broker.security.authorization import Op, require_authorizer, require_cluster
from oncelog.broker.services import BrokerServices
from oncelog.core.security.acl import binding_from_wire
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey

API_KEY = ApiKey.CREATE_ACLS
CONTROLLER_VERSION = 3


def decode(version: int, body: memoryview) -> Any:
    r = entities.decode_request(API_KEY, version, body)
    if any(binding_from_wire(c).is_unknown() for c in r.creations):
        raise ValueError("Contain UNKNOWN elements")
    return r


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    require_authorizer(broker)
    require_cluster(broker, Op.ALTER)
    creations = tuple(entities.make(entities.nested(API_KEY, CONTROLLER_VERSION, "request", "AclCreation"),
                                    resource_type=c.resource_type, resource_name=c.resource_name,
                                    resource_pattern_type=c.resource_pattern_type, principal=c.principal,
                                    host=c.host, operation=c.operation, permission_type=c.permission_type)
                      for c in r.creations)
    answer = await broker.security.client.request(API_KEY, CONTROLLER_VERSION, creations=creations)
    await broker.security.catch_up()
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode(throttle_time=0, results=tuple(
        rb("AclCreationResult", error_code=a.error_code, error_message=a.error_message) for a in answer.results))


def error_response(version: int, r: Any, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode(throttle_time=0, results=tuple(
        rb("AclCreationResult", error_code=code, error_message=None) for _ in r.creations))
