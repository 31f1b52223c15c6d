"""ApiVersions (API 18), v0-v4. A client that asks with a version above ours gets
UNSUPPORTED_VERSION in the v0 format with our ranges, and retries with a version we serve."""
from __future__ import annotations

from oncelog.protocol import api_versions, entities
from oncelog.protocol.api import BROKER_VERSIONS, ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.API_VERSIONS


def decode(version: int, body) -> None:
    """Nothing of the request is needed (and none of it can make the answer fail)."""
    return None


async def handle(broker, version: int, request: None) -> bytes:
    cls = entities.entity_class(API_KEY, version, "response")
    entry = entities.nested(API_KEY, version, "response", "ApiVersion")
    keys = tuple(entities.make(entry, api_key=k, min_version=lo, max_version=hi)
                 for k, (lo, hi) in sorted(BROKER_VERSIONS.items()))
    return entities.encode(entities.make(cls, error_code=ErrorCode.NONE, api_keys=keys, throttle_time=0,
                                         supported_features=(), finalized_features_epoch=-1,
                                         finalized_features=(), zk_migration_ready=False))


def unsupported_version() -> bytes:
    """The v0 body, which every client can read whatever version it sent."""
    return api_versions.encode_v0_response(ErrorCode.UNSUPPORTED_VERSION, BROKER_VERSIONS)
