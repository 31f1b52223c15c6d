"""ApiVersions (API 18), v0-v4. A client that asks with a version above ours gets
UNSUPPORTED_VERSION in the v0 format with our ranges, and retries with a version we serve.

From v3 the answer carries features (KIP-584, `core.features`): SupportedFeatures
(`transaction.version` 0-2; left out below v4, whose clients could not read a minimum of 0,
KAFKA-17492), and the cluster's FinalizedFeatures with their epoch, which only grows (clients keep
the answer with the highest epoch of any broker). A feature at level 0 is left out, as Kafka does.

The share-group APIs (76-79) are listed only while `share.version` is finalized at 1 or more, as
Kafka 4.2 lists them (clients decide from the list whether share groups exist)."""
from __future__ import annotations

from oncelog.broker.services import BrokerServices
from oncelog.core.features import SHARE_VERSION, SUPPORTED, FinalizedFeatures
from oncelog.protocol import api_versions, entities
from oncelog.protocol.api import BROKER_VERSIONS, SHARE_APIS, ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.API_VERSIONS


def decode(version: int, body: memoryview) -> None:
    """Nothing of the request is needed (and none of it can make the answer fail)."""
    return None


async def handle(broker: BrokerServices, version: int, request: None) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    shares = share_groups_enabled(broker)
    keys = tuple(rb("ApiVersion", api_key=k, min_version=lo, max_version=hi)
                 for k, (lo, hi) in sorted(BROKER_VERSIONS.items()) if shares or k not in SHARE_APIS)
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


def share_groups_enabled(broker: BrokerServices) -> bool:
    """Kafka's `isShareGroupProtocolEnabled`: the finalized `share.version` is 1 or more."""
    return finalized_features(broker).level(SHARE_VERSION) >= 1


def unsupported_version() -> bytes:
    """The v0 body, which every client can read whatever version it sent."""
    return api_versions.encode_v0_response(ErrorCode.UNSUPPORTED_VERSION, BROKER_VERSIONS)
