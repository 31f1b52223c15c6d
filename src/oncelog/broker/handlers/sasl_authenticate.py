"""SaslAuthenticate (API 36), v0-v2: as SaslHandshake, answered by the authenticator on SASL
listeners; elsewhere ILLEGAL_SASL_STATE."""
from __future__ import annotations

from typing import Any

from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.SASL_AUTHENTICATE


async def handle(broker: BrokerServices, version: int, request: Any) -> bytes:
    return entities.ResponseBuilder(API_KEY, version).encode(
        error_code=ErrorCode.ILLEGAL_SASL_STATE, error_message="no SASL on this listener", auth_bytes=b"",
        session_lifetime=0)
