"""SaslHandshake (API 17), v0-v1. On a SASL listener the connection's authenticator answers it
(`broker.security.authentication`); a request that reaches this handler came on a listener without SASL
(or after authentication), where Kafka answers ILLEGAL_SASL_STATE."""
from __future__ import annotations

from typing import Any

from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.SASL_HANDSHAKE


async def handle(broker: BrokerServices, version: int, request: Any) -> bytes:
    return entities.ResponseBuilder(API_KEY, version).encode(error_code=ErrorCode.ILLEGAL_SASL_STATE, mechanisms=())
