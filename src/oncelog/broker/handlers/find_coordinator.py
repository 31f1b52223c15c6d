"""FindCoordinator (API 10), v0-v4: which broker coordinates a group (the leader of its
`__consumer_offsets` partition, `Broker.group_coordinator`; that topic is created through the
controller on first need, as Kafka creates it) or a transactional id (key type 1: the leader of its
`__transaction_state` partition); COORDINATOR_NOT_AVAILABLE while the partition has no leader. v4 answers a
batch of keys (KIP-699). Needs DESCRIBE on the group (GROUP_AUTHORIZATION_FAILED) or on the
transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), checked first: `__transaction_state` is
created on first need only for a caller allowed to ask (Kafka's getCoordinator order), so a
refused request creates nothing."""
from __future__ import annotations

from typing import Any

from oncelog.broker.security import authorization as authz
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.FIND_COORDINATOR
GROUP, TRANSACTION = 0, 1


async def handle(broker: BrokerServices, version: int, request: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    key_type = int(getattr(request, "key_type", GROUP))
    keys = list(request.coordinator_keys) if version >= 4 else [request.key]
    answers: dict[str, dict[str, Any]] = {}
    allowed = []   # keys the caller may look up
    for key in dict.fromkeys(keys):
        answer = _answer(broker, key_type, key)
        if answer is None:
            allowed.append(key)
        else:
            answers[key] = answer
    if allowed:
        code = await (broker.txn.ensure_topic() if key_type == TRANSACTION else broker.group_ownership.ensure_topic())
        for key in allowed:
            answers[key] = _error(code) if code else _coordinator(
                broker.txn.coordinator_node(key) if key_type == TRANSACTION else broker.group_coordinator(key))
    if version >= 4:
        return rb.encode(throttle_time=0, coordinators=tuple(rb("Coordinator", key=key, **answers[key])
                                                             for key in keys))
    return rb.encode(throttle_time=0, **answers[request.key])


def _answer(broker: BrokerServices, key_type: int, key: str) -> dict[str, Any] | None:
    """The answer for `key`, or None for a key the caller may look up."""
    if key_type not in (GROUP, TRANSACTION):
        return _error(ErrorCode.INVALID_REQUEST, f"unknown key type {key_type}")
    resource = authz.TXN_ID if key_type == TRANSACTION else authz.GROUP
    if not authz.authorize(broker, authz.Op.DESCRIBE, resource, key):
        return _error(authz.denied_code(resource))
    if key_type == TRANSACTION and not key:
        return _error(ErrorCode.INVALID_REQUEST, "empty transactional id")
    return None


def _coordinator(found: tuple[int, str, int] | None) -> dict[str, Any]:
    if found is None:
        return _error(ErrorCode.COORDINATOR_NOT_AVAILABLE)
    node, host, port = found
    return dict(node_id=node, host=host, port=port, error_code=ErrorCode.NONE, error_message=None)


def _error(code: int, message: str | None = None) -> dict[str, Any]:
    return dict(node_id=-1, host="", port=-1, error_code=code, error_message=message)


def error_response(version: int, request: Any, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    if version >= 4:
        return rb.encode_error(code, coordinators=tuple(rb.error("Coordinator", code, key=key, error_message=None)
                                                        for key in request.coordinator_keys))
    return rb.encode_error(code, error_message=None)
