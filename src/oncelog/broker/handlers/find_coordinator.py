"""FindCoordinator (API 10), v0-v4: this broker coordinates every group (single node)."""
from __future__ import annotations

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.FIND_COORDINATOR
GROUP, TRANSACTION = 0, 1


def handle(broker, version: int, body) -> bytes:
    request = entities.decode_request(API_KEY, version, body)
    rb = entities.ResponseBuilder(API_KEY, version)
    key_type = int(getattr(request, "key_type", GROUP))
    code, message = ErrorCode.NONE, None
    if key_type != GROUP:
        code, message = ErrorCode.COORDINATOR_NOT_AVAILABLE, "transactions are not supported"
    me = dict(node_id=broker.node_id if not code else -1, host=broker.advertised_host if not code else "",
              port=broker.advertised_port if not code else -1, error_code=code, error_message=message)
    if version >= 4:
        return rb.encode(throttle_time=0, coordinators=tuple(
            rb("Coordinator", key=key, **me) for key in request.coordinator_keys))
    return rb.encode(throttle_time=0, **me)
