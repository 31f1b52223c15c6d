"""Authorization of requests, the one place handlers ask (docs/security.md §5).

`authorizer.class.name` set (any non-empty value; Kafka's StandardAuthorizer class name works as
it is) enables `core.security.authorizer.Authorizer` over the ACLs the broker follows from the
controller; empty, everything is allowed, the ACL APIs answer SECURITY_DISABLED and the
authorized-operations fields carry every supported operation.

The caller is `request_context.PRINCIPAL` from `request_context.CLIENT`'s host. A denial the
client asked for by name is logged at INFO on `oncelog.authorizer` (Kafka's
`kafka.authorizer.logger`); filtering (all-topics Metadata, ListGroups) is not (`audit=False`).
"""
from __future__ import annotations

import logging
from collections.abc import Iterable

from oncelog.broker.config import BrokerConfig
from oncelog.broker.net.request_context import CLIENT, PRINCIPAL
from oncelog.broker.services import BrokerServices
from oncelog.core.security.acl import AclOperation, ResourceType
from oncelog.core.security.authorizer import (
    AUTHORIZED_OPERATIONS_OMITTED,
    Authorizer,
    all_operations,
    parse_super_users,
)
from oncelog.core.security.metadata import SecurityMetadata
from oncelog.core.security.principal import KafkaPrincipal
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

audit_log = logging.getLogger("oncelog.authorizer")

TOPIC, GROUP, CLUSTER, TXN_ID = (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER,
                                 ResourceType.TRANSACTIONAL_ID)
CLUSTER_NAME = "kafka-cluster"
Op = AclOperation
# Kafka's INT32_MIN "not requested"; re-exported for handlers
OMITTED = AUTHORIZED_OPERATIONS_OMITTED


def make_authorizer(config: BrokerConfig) -> Authorizer | None:
    if not config["authorizer.class.name"].strip():
        return None
    return Authorizer(super_users=parse_super_users(config["super.users"]),
                      allow_everyone_if_no_acl_found=config["allow.everyone.if.no.acl.found"])


def follow_acls(authorizer: Authorizer | None, state: SecurityMetadata) -> None:
    """Point the authorizer at the followed ACLs (a snapshot from the controller replaces them)."""
    if authorizer is not None:
        authorizer.acls = state.acls


def _caller() -> tuple[KafkaPrincipal, str]:
    return PRINCIPAL.get(), CLIENT.get()[1].lstrip("/")


def authorize(broker: BrokerServices, operation: AclOperation, resource_type: ResourceType, name: str,
              audit: bool = True) -> bool:
    authorizer = broker.authorizer
    if authorizer is None:
        return True
    principal, host = _caller()
    decision = authorizer.decide(principal, host, operation, resource_type, name)
    if not decision.allowed and audit:
        audit_log.info("Principal = %s is Denied operation = %s from host = %s on resource = %s:%s based on "
                       "rule %s", principal, operation.name, host or "?", resource_type.name, name, decision.rule)
    return decision.allowed


def authorized_names(broker: BrokerServices, operation: AclOperation, resource_type: ResourceType, names: Iterable[str],
                     audit: bool = True) -> set[str]:
    """The names the caller may act on: one decision per distinct name (a Produce to 100
    partitions of a topic asks once)."""
    distinct = set(names)
    if broker.authorizer is None:
        return distinct
    return {n for n in distinct if authorize(broker, operation, resource_type, n, audit)}


def authorize_cluster(broker: BrokerServices, operation: AclOperation, audit: bool = True) -> bool:
    return authorize(broker, operation, CLUSTER, CLUSTER_NAME, audit)


def require_cluster(broker: BrokerServices, operation: AclOperation) -> None:
    """Raise CLUSTER_AUTHORIZATION_FAILED (the dispatcher answers it in the request's shape)."""
    if not authorize_cluster(broker, operation):
        raise KafkaProtocolError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                 f"{PRINCIPAL.get()} may not {operation.name} the cluster")


def require_broker(broker: BrokerServices, request: str) -> None:
    """A broker-only request (WriteTxnMarkers, AddPartitionsToTxn v4): only another broker of the
    cluster, authenticated with the cluster credential (`broker.security.inter_broker`), may send it; it
    holds CLUSTER_ACTION implicitly, and no ACL or super user stands in for it. Anyone else:
    CLUSTER_AUTHORIZATION_FAILED, with an audit line."""
    principal = PRINCIPAL.get()
    if principal.broker:
        return
    audit_log.info("Principal = %s is Denied operation = CLUSTER_ACTION from host = %s on resource = "
                   "CLUSTER:LITERAL:%s for request = %s: only brokers, authenticated with the cluster "
                   "credential, send it", principal, _caller()[1] or "?", CLUSTER_NAME, request)
    raise KafkaProtocolError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                             f"{principal} is not a broker of this cluster: {request} is for brokers only")


def authorize_by_resource_type(broker: BrokerServices, operation: AclOperation, resource_type: ResourceType) -> bool:
    authorizer = broker.authorizer
    if authorizer is None:
        return True
    principal, host = _caller()
    return authorizer.authorize_by_resource_type(principal, host, operation, resource_type)


def authorized_operations(broker: BrokerServices, resource_type: ResourceType, name: str,
                          requested: bool = True) -> int:
    """KIP-430's bitfield for the caller: OMITTED when not asked for, every supported operation
    without an authorizer."""
    if not requested:
        return OMITTED
    authorizer = broker.authorizer
    if authorizer is None:
        return all_operations(resource_type)
    principal, host = _caller()
    return authorizer.authorized_operations(principal, host, resource_type, name)


def require_authorizer(broker: BrokerServices) -> None:
    if broker.authorizer is None:
        raise KafkaProtocolError(ErrorCode.SECURITY_DISABLED, "No Authorizer is configured.")


_DENIED = {TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED, GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
           CLUSTER: ErrorCode.CLUSTER_AUTHORIZATION_FAILED, TXN_ID: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}


def denied_code(resource_type: ResourceType) -> ErrorCode:
    """Kafka's error for an action refused on a resource of this type."""
    return _DENIED[resource_type]


def require(broker: BrokerServices, operation: AclOperation, resource_type: ResourceType, name: str) -> None:
    """Raise the type's authorization error (the dispatcher answers it in the request's shape,
    Kafka's getErrorResponse)."""
    if not authorize(broker, operation, resource_type, name):
        raise KafkaProtocolError(_DENIED[resource_type],
                                 f"{PRINCIPAL.get()} may not {operation.name} {resource_type.name} {name!r}")


# Kafka's ConfigResource.Type ids -> the ACL resource its configs are authorized on
_CONFIG_RESOURCES = {2: TOPIC, 4: CLUSTER, 8: CLUSTER, 32: GROUP}


def config_denied(broker: BrokerServices, operation: AclOperation, config_resource_type: int,
                  name: str) -> ErrorCode | None:
    """DescribeConfigs/AlterConfigs/IncrementalAlterConfigs: None if the caller may, else the error
    for that resource (topics on the topic, broker settings on the cluster, group configs on the
    group; Kafka's ConfigHelper/AuthHelper)."""
    resource = _CONFIG_RESOURCES.get(config_resource_type)
    if resource is None:
        return None          # the handler refuses the type itself
    if authorize(broker, operation, resource, CLUSTER_NAME if resource is CLUSTER else name):
        return None
    return _DENIED[resource]
