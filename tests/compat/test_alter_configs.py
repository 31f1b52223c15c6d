"""AlterConfigs (legacy API 33) against a real `oncelog serve`, sent by unmodified admin clients
(confluent-kafka's alter_configs, kafka-python's alter_configs): a topic's overrides are replaced
wholesale, so a config left out reverts to its default (Kafka's legacy semantics, which librdkafka
0092 relies on); validate_only changes nothing; Kafka's errors."""
import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

pytestmark = pytest.mark.processes


def describe(admin, topic):
    [f] = admin.describe_configs([ConfigResource("topic", topic)]).values()
    return {k: (v.value, v.is_default) for k, v in f.result(10).items()}


def alter(admin, topic, configs, validate_only=False):
    """The error code (None: done)."""
    [f] = admin.alter_configs([ConfigResource("topic", topic, set_config=configs)],
                              validate_only=validate_only).values()
    try:
        f.result(10)
    except KafkaException as e:
        return e.args[0].code()
    return None


def test_legacy_alter_configs_replaces_the_overrides(shared_broker, unique_topic):
    admin = AdminClient({"bootstrap.servers": shared_broker.bootstrap})
    admin.create_topics([NewTopic(unique_topic, 1, 1, config={"retention.ms": "60000",
                                                              "compression.type": "lz4"})])[unique_topic].result(30)
    assert alter(admin, unique_topic, {"compression.type": "gzip", "flush.ms": "12345678"}) is None
    configs = describe(admin, unique_topic)
    assert configs["compression.type"] == ("gzip", False)
    assert configs["flush.ms"] == ("12345678", False)
    assert configs["retention.ms"] == ("604800000", True)  # left out: back to the default
    # validate_only checks and changes nothing
    assert alter(admin, unique_topic, {"retention.ms": "1000"}, validate_only=True) is None
    assert alter(admin, unique_topic, {"retention.ms": "x"}, validate_only=True) == KafkaError.INVALID_CONFIG
    assert describe(admin, unique_topic)["compression.type"] == ("gzip", False)
    assert alter(admin, unique_topic, {"compression.type": "brotli"}) == KafkaError.INVALID_CONFIG
    assert alter(admin, unique_topic, {"no.such.config": "1"}) == KafkaError.INVALID_CONFIG
    assert alter(admin, unique_topic + "-missing", {"flush.ms": "1"}) == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert describe(admin, unique_topic)["flush.ms"] == ("12345678", False)  # refusals changed nothing
    # kafka-python's admin, told to use the legacy API (it merges the topic's current overrides in
    # first, so nothing else reverts)
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import ConfigResourceType
    k = KafkaAdminClient(bootstrap_servers=shared_broker.bootstrap)
    try:
        k.alter_configs([KConfigResource(ConfigResourceType.TOPIC, unique_topic, configs={"retention.ms": "5000"})],
                        incremental=False)
    finally:
        k.close()
    configs = describe(admin, unique_topic)
    assert configs["retention.ms"] == ("5000", False) and configs["flush.ms"] == ("12345678", False), configs
