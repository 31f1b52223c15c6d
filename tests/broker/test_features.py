"""The `transaction.version` feature (KIP-584, Kafka 4.0's TransactionVersion): ApiVersions
reports it supported 0-2 and finalized at 2 by default (and `share.version` 0-2, finalized at 1,
which lists the share-group APIs only while it is 1 or more); UpdateFeatures (what kafka-features.sh
sends) changes it through the controller's metadata log, so it survives a restart, and its epoch
only grows. Bad updates get Kafka's codes and change nothing."""
from __future__ import annotations

import pytest

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.raw_client import RawConnection

pytestmark = pytest.mark.processes


def features(c: RawConnection, version: int = 4):
    r = c.call(ApiKey.API_VERSIONS, version, client_software_name="t", client_software_version="1")
    finalized = {str(f.name): (int(f.min_version_level), int(f.max_version_level)) for f in r.finalized_features}
    supported = {str(f.name): (int(f.min_version), int(f.max_version)) for f in r.supported_features}
    # share.version has its own test below
    finalized.pop("share.version", None)
    supported.pop("share.version", None)
    return supported, finalized, int(r.finalized_features_epoch)


def update(c: RawConnection, level: int, upgrade_type: int = 1, feature: str = "transaction.version",
           version: int = 1, validate_only: bool = False):
    mod = entities.module(ApiKey.UPDATE_FEATURES, version, "request")
    key = (dict(upgrade_type=upgrade_type) if version >= 1 else dict(allow_downgrade=upgrade_type != 1))
    extra = dict(validate_only=validate_only) if version >= 1 else {}
    r = c.call(ApiKey.UPDATE_FEATURES, version, feature_updates=(
        entities.make(mod.FeatureUpdateKey, feature=feature, max_version_level=level, **key),), **extra)
    return int(r.error_code)


def test_transaction_version_is_supported_0_to_2_and_finalized_at_2(broker):
    c = RawConnection(broker.bootstrap)
    supported, finalized, epoch = features(c)
    assert supported == {"transaction.version": (0, 2)}
    assert finalized == {"transaction.version": (2, 2)} and epoch >= 0
    # below v4 a minimum of 0 is left out (KAFKA-17492); the finalized level is not
    assert features(c, 3)[:2] == ({}, {"transaction.version": (2, 2)})
    # and the versions that speak Transactions V2 are advertised with it
    r = c.call(ApiKey.API_VERSIONS, 3, client_software_name="t", client_software_version="1")
    top = {int(k.api_key): int(k.max_version) for k in r.api_keys}
    assert top[ApiKey.END_TXN] >= 5 and top[ApiKey.PRODUCE] >= 12 and top[ApiKey.TXN_OFFSET_COMMIT] >= 5


def test_update_features_downgrades_and_upgrades_and_the_level_survives_a_restart(tmp_path):
    b = BrokerProcess(tmp_path / "data").start()
    try:
        c = RawConnection(b.bootstrap)
        _s, _f, epoch0 = features(c)
        assert update(c, 1) == E.INVALID_UPDATE_VERSION                # a downgrade not asked for as one
        assert update(c, 1, validate_only=True, upgrade_type=2) == E.NONE
        assert features(c)[1:] == ({"transaction.version": (2, 2)}, epoch0)   # validate only
        assert update(c, 1, upgrade_type=2) == E.NONE
        _s, finalized, epoch1 = features(c)
        assert finalized == {"transaction.version": (1, 1)} and epoch1 > epoch0
        assert update(c, 0, upgrade_type=2, version=0) == E.NONE       # v0: allowDowngrade; 0 = not finalized
        _s, finalized, epoch2 = features(c)
        assert finalized == {} and epoch2 > epoch1
    finally:
        b.stop()
    b = BrokerProcess(tmp_path / "data").start()
    try:
        c = RawConnection(b.bootstrap)
        assert features(c)[1:] == ({}, epoch2)
        assert update(c, 2, version=2) == E.NONE
        assert features(c)[1] == {"transaction.version": (2, 2)}
    finally:
        b.stop()


@pytest.mark.parametrize("feature,level,code", [
    ("transaction.version", 3, E.INVALID_UPDATE_VERSION),
    ("metadata.version", 1, E.INVALID_UPDATE_VERSION),
    ("no.such.feature", 1, E.INVALID_UPDATE_VERSION),
])
def test_bad_updates_are_refused_and_change_nothing(broker, feature, level, code):
    c = RawConnection(broker.bootstrap)
    before = features(c)
    assert update(c, level, feature=feature) == code
    assert update(c, 1, upgrade_type=7) == E.INVALID_REQUEST
    assert features(c) == before


SHARE = {ApiKey.SHARE_GROUP_HEARTBEAT: (1, 1), ApiKey.SHARE_GROUP_DESCRIBE: (1, 1), ApiKey.SHARE_FETCH: (1, 2),
         ApiKey.SHARE_ACKNOWLEDGE: (1, 2), ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: (0, 1),
         ApiKey.ALTER_SHARE_GROUP_OFFSETS: (0, 0), ApiKey.DELETE_SHARE_GROUP_OFFSETS: (0, 0)}


def test_share_version_lists_the_share_group_apis_only_while_finalized(tmp_path):
    b = BrokerProcess(tmp_path / "data").start()
    try:
        c = RawConnection(b.bootstrap)
        r = c.call(ApiKey.API_VERSIONS, 4, client_software_name="t", client_software_version="1")
        assert {str(f.name): (int(f.min_version), int(f.max_version)) for f in r.supported_features
                }["share.version"] == (0, 2)   # 2: KIP-1191's dead-letter topics
        assert {str(f.name): int(f.max_version_level) for f in r.finalized_features}["share.version"] == 1
        listed = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in r.api_keys}
        assert {k: listed.get(k) for k in SHARE} == SHARE
        assert update(c, 0, upgrade_type=2, feature="share.version") == E.NONE
        r = c.call(ApiKey.API_VERSIONS, 4, client_software_name="t", client_software_version="1")
        assert not {int(k.api_key) for k in r.api_keys} & set(SHARE)
        assert "share.version" not in {str(f.name) for f in r.finalized_features}
        # and a share-group heartbeat is refused as Kafka refuses it with share groups off
        hb = c.call(ApiKey.SHARE_GROUP_HEARTBEAT, 1, group_id="g", member_id="m", member_epoch=0,
                    subscribed_topic_names=("t",))
        assert int(hb.error_code) == E.UNSUPPORTED_VERSION
    finally:
        b.stop()
