"""The pure part of dynamic broker configs (core.broker_config): Kafka's name rules, the
incremental ops, and the store's records, replay and snapshot."""
import pytest

from oncelog.core import broker_config as bc
from oncelog.core.security.metadata import SecurityMetadata
from oncelog.core.topic_config import ConfigError


def test_kafkas_name_rules():
    bc.check_names(["sasl.kerberos.min.time.before.relogin", "background.threads", "log.cleanup.policy",
                    "listener.name.external.ssl.keystore.location"], per_broker=True)
    bc.check_names(["log.retention.ms", "max.connections", "listener.name.external.max.connections"],
                   per_broker=False)
    with pytest.raises(ConfigError, match=r"Cannot update these configs dynamically: Set\(log.dirs, node.id\)"):
        bc.check_names(["node.id", "log.dirs", "log.retention.ms"], per_broker=True)
    with pytest.raises(ConfigError, match="Cannot update these configs dynamically"):
        bc.check_names(["log.message.format.version"], per_broker=True)   # Kafka's one log exception
    with pytest.raises(ConfigError, match="only per-listener using the listener prefix"):
        bc.check_names(["ssl.keystore.location"], per_broker=True)
    with pytest.raises(ConfigError, match="broker id must be specified"):
        bc.check_names(["sasl.kerberos.min.time.before.relogin"], per_broker=False)
    with pytest.raises(ConfigError, match="broker id must be specified"):
        bc.check_names(["listener.name.external.ssl.keystore.location"], per_broker=False)
    assert bc.is_sensitive("listener.name.external.ssl.key.password")
    assert bc.kind("listener.name.x.plain.sasl.jaas.config") == "password"


def test_incremental_ops():
    ops = [("log.cleanup.policy", bc.APPEND, "compact"), ("background.threads", bc.SET, "9"),
           ("num.io.threads", bc.DELETE, None)]
    assert bc.apply_ops({"num.io.threads": "4"}, ops) == {"log.cleanup.policy": "delete,compact",
                                                          "background.threads": "9"}
    assert bc.apply_ops({"log.cleanup.policy": "delete,compact"},
                        [("log.cleanup.policy", bc.SUBTRACT, "compact")]) == {"log.cleanup.policy": "delete"}
    with pytest.raises(ConfigError, match="append is not allowed"):
        bc.apply_ops({}, [("background.threads", bc.APPEND, "1")])


def test_store_records_replay_and_snapshot():
    store = bc.BrokerConfigStore()
    records = store.decide("1", {"background.threads": "9", "log.retention.ms": "1000"})
    for r in records:
        store.replay(r)
    assert store.get("1") == {"background.threads": "9", "log.retention.ms": "1000"}
    assert store.decide("1", store.get("1")) == []                   # nothing to change, nothing written
    for r in store.decide("1", {"log.retention.ms": "1000"}):
        store.replay(r)
    assert store.get("1") == {"log.retention.ms": "1000"} and store.get("") == {}
    meta = SecurityMetadata()
    for r in store.to_snapshot():
        assert SecurityMetadata.handles(r)
        meta.replay(r)
    again = SecurityMetadata.from_snapshot(meta.to_snapshot())
    assert again.broker_configs.get("1") == {"log.retention.ms": "1000"}
    old = meta.to_snapshot()
    del old["broker_configs"]            # a snapshot written before dynamic broker configs
    assert SecurityMetadata.from_snapshot(old).broker_configs.scopes == {}
    with pytest.raises(ValueError):
        store.replay({"type": bc.BROKER_CONFIG_RECORD, "broker": 1, "name": "x", "value": "1"})
