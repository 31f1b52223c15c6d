"""FindCoordinator (API 10), v0-v4: which broker coordinates a group (`Broker.group_coordinator`)
or a transactional id (key type 1: the leader of its `__transaction_state` partition, the topic
created on first need). v4 answers a batch of keys (KIP-699). Needs DESCRIBE on the group
(GROUP_AUTHORIZATION_FAILED) or on the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)."""
from __future__ import annotations

from oncelog.broker import authorization as authz
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.FIND_COORDINATOR
GROUP, TRANSACTION = 0, 1


async def handle(broker, version: int, request) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    key_type = int(getattr(request, "key_type", GROUP))
    code, message = ErrorCode.NONE, None
    if key_type == TRANSACTION:
        code = await broker.txn.ensure_topic()
    elif key_type != GROUP:
        code, message = ErrorCode.INVALID_REQUEST, f"unknown key type {key_type}"

    def answer(key: str) -> dict:
        if code:
            return dict(node_id=-1, host="", port=-1, error_code=code, error_message=message)
        resource = authz.TXN_ID if key_type == TRANSACTION else authz.GROUP
        if not authz.authorize(broker, authz.Op.DESCRIBE, resource, key):
            return dict(node_id=-1, host="", port=-1, error_code=authz.denied_code(resource), error_message=None)
        if key_type == TRANSACTION:
            if not key:
                return dict(node_id=-1, host="", port=-1, error_code=ErrorCode.INVALID_REQUEST,
                            error_message="empty transactional id")
            found = broker.txn.coordinator_node(key)
            if found is None:
                return dict(node_id=-1, host="", port=-1, error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE,
                            error_message=None)
            node, host, port = found
        else:
            node, host, port = broker.group_coordinator(key)
        return dict(node_id=node, host=host, port=port, error_code=ErrorCode.NONE, error_message=None)
    if version >= 4:
        return rb.encode(throttle_time=0, coordinators=tuple(
            rb("Coordinator", key=key, **answer(key)) for key in request.coordinator_keys))
    return rb.encode(throttle_time=0, **answer(request.key))


def error_response(version: int, request, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    if version >= 4:
        return rb.encode_error(code, coordinators=tuple(rb.error("Coordinator", code, key=key, error_message=None)
                                                        for key in request.coordinator_keys))
    return rb.encode_error(code, error_message=None)
