"""AlterUserScramCredentials (API 51), v0: forwarded to the controller, which validates, appends
the credential records to its metadata log and answers per user (`controller/scram.py`). The
client salts and hashes; no password reaches the broker."""
from __future__ import annotations

from oncelog.broker.controller_client import ControllerUnavailable
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.ALTER_USER_SCRAM_CREDENTIALS


async def handle(broker, version: int, request) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    try:
        r = await broker.credentials.client().raw(API_KEY, 0, entities.encode(request))
    except ControllerUnavailable:
        names = {str(d.name) for d in request.deletions} | {str(u.name) for u in request.upsertions}
        return rb.encode(throttle_time=0, results=tuple(
            rb("AlterUserScramCredentialsResult", user=n, error_code=ErrorCode.NOT_CONTROLLER,
               error_message="the controller is not reachable") for n in sorted(names)))
    return bytes(r)
