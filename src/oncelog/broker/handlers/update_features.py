"""UpdateFeatures (API 57), v0-v2: what `kafka-features.sh upgrade|downgrade` and `oncelog
features` send to change a finalized feature's level (`core.features`; oncelog's only feature is
`transaction.version`). Needs ALTER on the cluster (CLUSTER_AUTHORIZATION_FAILED, as Kafka).
Forwarded to the controller, which checks it and appends it to its metadata log; every broker
follows the new level, this one before it answers. v0's AllowDowngrade is a safe downgrade; v2
answers with the top-level error only (no per-feature results)."""
from __future__ import annotations

from typing import Any

from oncelog.broker.security.authorization import Op, require_cluster
from oncelog.broker.services import BrokerServices
from oncelog.core.features import SAFE_DOWNGRADE, UPGRADE
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

API_KEY = ApiKey.UPDATE_FEATURES
CONTROLLER_VERSION = 1


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    require_cluster(broker, Op.ALTER)
    updates = [(str(u.feature), int(u.max_version_level),
                int(u.upgrade_type) if version >= 1 else SAFE_DOWNGRADE if u.allow_downgrade else UPGRADE)
               for u in r.feature_updates]
    code, message = ErrorCode.NONE, None
    try:
        mod = entities.module(API_KEY, CONTROLLER_VERSION, "request")
        answer = await broker.security.client.request(
            API_KEY, CONTROLLER_VERSION, timeout=r.timeout, validate_only=bool(getattr(r, "validate_only", False)),
            feature_updates=tuple(entities.make(mod.FeatureUpdateKey, feature=n, max_version_level=level,
                                                upgrade_type=kind) for n, level, kind in updates))
        if int(answer.error_code):
            raise KafkaProtocolError(ErrorCode(int(answer.error_code)), answer.error_message)
        await broker.security.catch_up()
    except KafkaProtocolError as e:
        code, message = ErrorCode(e.code), e.message
    return _answer(version, r, code, message)


def _answer(version: int, r: Any, code: int, message: str | None) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    if version >= 2:
        return rb.encode(throttle_time=0, error_code=code, error_message=message)
    return rb.encode(throttle_time=0, error_code=code, error_message=message, results=tuple(
        rb("UpdatableFeatureResult", feature=u.feature, error_code=code, error_message=message)
        for u in r.feature_updates))


def error_response(version: int, request: Any, code: int) -> bytes:
    return _answer(version, request, code, None)
