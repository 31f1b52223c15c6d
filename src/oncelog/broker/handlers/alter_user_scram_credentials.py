"""AlterUserScramCredentials (API 51), v0: forwarded to the controller, which validates, appends
the credential records to its metadata log and answers per user (`controller/scram.py`). The
client salts and hashes; no password reaches the broker. Needs ALTER on the cluster, as in Kafka."""
from __future__ import annotations

import contextlib
from typing import Any

from oncelog.broker.cluster.controller_client import ControllerUnavailable
from oncelog.broker.security.authorization import Op, authorize_cluster
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

API_KEY = ApiKey.ALTER_USER_SCRAM_CREDENTIALS


async def handle(broker: BrokerServices, version: int, request: Any) -> bytes:
    if not authorize_cluster(broker, Op.ALTER):
        return error_response(version, request, ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    try:
        r = await broker.credentials.client().raw(API_KEY, 0, entities.encode(request))
    except ControllerUnavailable:
        return error_response(version, request, ErrorCode.NOT_CONTROLLER, "the controller is not reachable")
    # logins ask the controller; the followed copy shapes the mock of unknown users (scram.mock_credential)
    with contextlib.suppress(ControllerUnavailable, KafkaProtocolError):   # then the next poll catches up
        await broker.security.catch_up()
    return bytes(r)


def error_response(version: int, request: Any, code: int, message: str | None = None) -> bytes:
    """Every user named in the request, failed with `code`."""
    rb = entities.ResponseBuilder(API_KEY, version)
    names = {str(d.name) for d in request.deletions} | {str(u.name) for u in request.upsertions}
    return rb.encode(throttle_time=0, results=tuple(
        rb("AlterUserScramCredentialsResult", user=n, error_code=code, error_message=message)
        for n in sorted(names)))
