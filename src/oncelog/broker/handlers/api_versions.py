"""ApiVersions (API 18), v0-v4. A client that asks with a version above ours gets
UNSUPPORTED_VERSION in the v0 format with our ranges, and retries with a version we serve.

From v3 the answer carries features (KIP-584, `core.features`): SupportedFeatures
(`transaction.version` 0-2; left out below v4, whose clients could not read a minimum of 0,
KAFKA-17492), and the cluster's FinalizedFeatures with their epoch, which only grows (clients keep
the answer with the highest epoch of any broker). A feature at level 0 is left out, as Kafka does."""
from __future__ import annotations

from oncelog.broker.services import BrokerServices
from oncelog.core.features import SUPPORTED, FinalizedFeatures
from oncelog.protocol import api_versions, entities
from oncelog.protocol.api import BROKER_VERSIONS, ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.API_VERSIONS


def decode(version: int, body: memoryview) -> None:
    """Nothing of the request is needed (and none of it can make the answer fail)."""
    return None


async def handle(broker: BrokerServices, version: int, request: None) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    keys = tuple(rb("ApiVersion", api_key=k, min_version=lo, max_version=hi)
                 for k, (lo, hi) in sorted(BROKER_VERSIONS.items()))
    if version < 3:
        return rb.encode(error_code=ErrorCode.NONE, api_keys=keys, throttle_time=0)
    features = finalized_features(broker)
    supported = tuple(rb("SupportedFeatureKey", name=name, min_version=lo, max_version=hi)
                      for name, (lo, hi) in sorted(SUPPORTED.items()) if lo > 0 or version >= 4)
    finalized = tuple(rb("FinalizedFeatureKey", name=name, max_version_level=level, min_version_level=level)
                      for name, level in features.finalized().items())
    return rb.encode(error_code=ErrorCode.NONE, api_keys=keys, throttle_time=0, supported_features=supported,
                     finalized_features_epoch=features.epoch, finalized_features=finalized,
                     zk_migration_ready=False)


def finalized_features(broker: BrokerServices) -> FinalizedFeatures:
    """What this broker follows of the controller's finalized features (the defaults until it
    has heard from the controller)."""
    return broker.security.state.features


def unsupported_version() -> bytes:
    """The v0 body, which every client can read whatever version it sent."""
    return api_versions.encode_v0_response(ErrorCode.UNSUPPORTED_VERSION, BROKER_VERSIONS)
