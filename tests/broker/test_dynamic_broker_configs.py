"""Dynamic broker configs (Kafka's KIP-226) against a real `oncelog serve`: AlterConfigs and
IncrementalAlterConfigs on a BROKER resource from unmodified admin clients (confluent-kafka,
kafka-python) and, for the cluster-wide default (the empty name, which both clients refuse to
send), a hand-built request. Kept in the controller's metadata log: they survive a restart and
DescribeConfigs names their source; Kafka's non-dynamic configs are refused with
INVALID_REQUEST and change nothing; the ones oncelog reads take effect at once."""
from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from test_dedup_raw import Conn

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.testing.embedded import BrokerProcess

pytestmark = pytest.mark.processes

KERBEROS = "sasl.kerberos.min.time.before.relogin"


def incremental(admin, name: str, *ops: tuple[str, str, AlterConfigOpType], validate_only=False):
    """The error (None: done) of IncrementalAlterConfigs on BROKER `name`."""
    entries = [ConfigEntry(k, v, incremental_operation=op) for k, v, op in ops]
    [f] = admin.incremental_alter_configs([ConfigResource("broker", name, incremental_configs=entries)],
                                          validate_only=validate_only).values()
    try:
        f.result(10)
    except KafkaException as e:
        return e.args[0]
    return None


def describe_broker(admin, name: str = "1"):
    [f] = admin.describe_configs([ConfigResource("broker", name)]).values()
    return f.result(10)


def cluster_default(bootstrap: str, configs: dict[str, str | None], name: str = "") -> tuple[int, str | None]:
    """IncrementalAlterConfigs SET (or DELETE, value None) on BROKER `name`, by default the empty
    one (the cluster-wide default), sent to the broker at `bootstrap`."""
    async def run():
        host, port = bootstrap.rsplit(":", 1)
        conn = await Conn.open(host, int(port))
        try:
            mod = entities.module(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "request")
            req = entities.make(mod.IncrementalAlterConfigsRequest, validate_only=False, resources=(
                entities.make(mod.AlterConfigsResource, resource_type=4, resource_name=name, configs=tuple(
                    entities.make(mod.AlterableConfig, name=k, config_operation=0 if v is not None else 1, value=v)
                    for k, v in configs.items())),))
            r = await conn.kio(req, entities.entity_class(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "response"))
            return int(r.responses[0].error_code), r.responses[0].error_message
        finally:
            await conn.close()
    return asyncio.run(run())


def test_dynamic_broker_configs_survive_a_restart_with_their_source(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    # librdkafka 0081's broker change: a per-broker SASL config oncelog stores but does not use
    assert incremental(admin, "1", (KERBEROS, "58000", AlterConfigOpType.SET),
                       ("log.cleanup.policy", "compact", AlterConfigOpType.APPEND)) is None
    assert cluster_default(broker.bootstrap, {"log.retention.ms": "7200000"}) == (0, None)
    # the legacy API (kafka-python sends it)
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource as KResource
    from kafka.admin import ConfigResourceType
    k = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        k.alter_configs([KResource(ConfigResourceType.BROKER, "1", configs={KERBEROS: "59000",
                                                                             "background.threads": "9"})],
                        incremental=False)
    finally:
        k.close()

    def check(configs):
        assert configs[KERBEROS].value == "59000"
        assert configs[KERBEROS].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
        assert not configs[KERBEROS].is_read_only
        assert configs["background.threads"].value == "9"
        # APPEND from Kafka's default; kafka-python's legacy call carried it over (it sends the
        # broker's other dynamic values with its own, as the legacy API replaces the whole set)
        assert configs["log.cleanup.policy"].value == "delete,compact"
        assert configs["log.retention.ms"].value == "7200000"
        assert configs["log.retention.ms"].source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
        assert configs["log.dirs"].is_read_only
        assert configs["log.dirs"].source != ConfigSource.DYNAMIC_BROKER_CONFIG.value

    check(describe_broker(admin))
    broker.restart()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    check(describe_broker(admin))


def test_non_dynamic_configs_are_refused_and_change_nothing(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    before = {k: (v.value, v.source) for k, v in describe_broker(admin).items()}
    e = incremental(admin, "1", ("log.dirs", "/elsewhere", AlterConfigOpType.SET),
                    (KERBEROS, "58000", AlterConfigOpType.SET))
    assert e.code() == KafkaError.INVALID_REQUEST and "Cannot update these configs dynamically" in e.str()
    assert "log.dirs" in e.str()
    e = incremental(admin, "1", ("num.partitions", "7", AlterConfigOpType.SET))
    assert e.code() == KafkaError.INVALID_REQUEST
    code, message = cluster_default(broker.bootstrap, {KERBEROS: "58000"}, name="2")   # not this broker
    assert code == KafkaError.INVALID_REQUEST and "Unexpected broker id" in message
    e = incremental(admin, "1", ("message.max.bytes", "lots", AlterConfigOpType.SET))
    assert e.code() == KafkaError.INVALID_REQUEST
    # a per-broker config at the cluster level, and an SSL store without its listener prefix
    code, message = cluster_default(broker.bootstrap, {KERBEROS: "58000"})
    assert code == KafkaError.INVALID_REQUEST and "broker id must be specified" in message
    e = incremental(admin, "1", ("ssl.keystore.location", "/k.pem", AlterConfigOpType.SET))
    assert e.code() == KafkaError.INVALID_REQUEST and "listener prefix" in e.str()
    # validate_only: checked, accepted, not stored
    assert incremental(admin, "1", (KERBEROS, "58000", AlterConfigOpType.SET), validate_only=True) is None
    assert {k: (v.value, v.source) for k, v in describe_broker(admin).items()} == before
    broker.restart()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    after = describe_broker(admin)
    assert after[KERBEROS].value is None
    assert not [k for k, v in after.items() if v.source in (ConfigSource.DYNAMIC_BROKER_CONFIG.value,
                                                             ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)]


def _produce(bootstrap: str, topic: str, size: int):
    """The delivery error of one record of `size` bytes (None: delivered)."""
    p = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 10_000_000})
    out = []
    p.produce(topic, b"x" * size, on_delivery=lambda err, msg: out.append(err))
    p.flush(30)
    assert out, "no delivery report"
    return out[0]


def test_a_dynamic_topic_default_takes_effect_without_a_restart(broker, unique_topic):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(unique_topic, 1, 1)])[unique_topic].result(30)
    admin.create_topics([NewTopic(unique_topic + "-own", 1, 1, config={"max.message.bytes": "100000"})]
                        )[unique_topic + "-own"].result(30)
    assert _produce(broker.bootstrap, unique_topic, 20_000) is None
    # message.max.bytes, the broker-wide default of max.message.bytes, for every broker at once
    assert cluster_default(broker.bootstrap, {"message.max.bytes": "10000"}) == (0, None)
    err = _produce(broker.bootstrap, unique_topic, 20_000)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err
    assert _produce(broker.bootstrap, unique_topic + "-own", 20_000) is None    # its override wins
    [f] = admin.describe_configs([ConfigResource("topic", unique_topic)]).values()
    entry = f.result(10)["max.message.bytes"]
    assert (entry.value, entry.source) == ("10000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    # this broker's own value wins over the cluster default; deleting it falls back
    assert incremental(admin, "1", ("message.max.bytes", "50000", AlterConfigOpType.SET)) is None
    assert _produce(broker.bootstrap, unique_topic, 20_000) is None
    broker.restart()   # still in force after a restart
    assert _produce(broker.bootstrap, unique_topic, 20_000) is None
    assert incremental(admin := AdminClient({"bootstrap.servers": broker.bootstrap}), "1",
                       ("message.max.bytes", "", AlterConfigOpType.DELETE)) is None
    err = _produce(broker.bootstrap, unique_topic, 20_000)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err
    assert cluster_default(broker.bootstrap, {"message.max.bytes": None}) == (0, None)
    assert _produce(broker.bootstrap, unique_topic, 20_000) is None


def test_altering_broker_configs_needs_alter_configs_on_the_cluster(tmp_path):
    def on_cluster(op):
        return AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, "User:ANONYMOUS", "*",
                          op, AclPermissionType.ALLOW)

    b = BrokerProcess(tmp_path / "data", {"authorizer.class.name": "StandardAuthorizer",
                                          "allow.everyone.if.no.acl.found": "true"}).start()
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        # ALTER (to manage ACLs) and DESCRIBE_CONFIGS on the cluster, not ALTER_CONFIGS
        for f in admin.create_acls([on_cluster(AclOperation.ALTER), on_cluster(AclOperation.DESCRIBE_CONFIGS)]
                                   ).values():
            f.result(10)
        b.overrides["allow.everyone.if.no.acl.found"] = "false"
        b.restart(clean=False)
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        e = incremental(admin, "1", (KERBEROS, "58000", AlterConfigOpType.SET))
        assert e is not None and e.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
        assert describe_broker(admin)[KERBEROS].value is None
        for f in admin.create_acls([on_cluster(AclOperation.ALTER_CONFIGS)]).values():
            f.result(10)
        assert incremental(admin, "1", (KERBEROS, "58000", AlterConfigOpType.SET)) is None
        assert describe_broker(admin)[KERBEROS].value == "58000"
    finally:
        b.stop()
