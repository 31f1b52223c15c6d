"""CreatePartitions (API 37, KIP-195) against a real `oncelog serve`, asked by unmodified admin
clients (confluent-kafka's AdminClient, kafka-python's KafkaAdminClient): a topic grows, Metadata
shows the new partitions with a leader, a librdkafka producer writes to a new partition after its
metadata refresh and a consumer reads it; Kafka's errors; on a cluster the controller places the
new partitions' leaders (librdkafka tests 0044, 0045, 0069, 0112, 0113 k)."""
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from oncelog.testing.cluster import LocalCluster


def create_topic(admin, topic, partitions):
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def grow(admin, topic, count, assignments=None, validate_only=False):
    """The error code of CreatePartitions (None: done)."""
    try:
        new = NewPartitions(topic, count) if assignments is None else NewPartitions(topic, count, assignments)
        admin.create_partitions([new], validate_only=validate_only,
                                request_timeout=30)[topic].result(30)
    except KafkaException as e:
        return e.args[0].code()
    return None


def partitions_seen(admin, topic, expected, timeout_s=30):
    """Metadata's partitions of `topic` once it shows `expected` of them (a cluster's brokers follow
    the controller, so poll as a client would)."""
    deadline = time.monotonic() + timeout_s
    while True:
        parts = admin.list_topics(topic, timeout=10).topics[topic].partitions
        if len(parts) == expected:
            return parts
        assert time.monotonic() < deadline, f"{topic} shows {len(parts)} partitions, not {expected}"
        time.sleep(0.1)


def produce_and_read(bootstrap, topic, partition):
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                  "topic.metadata.refresh.interval.ms": 500})
    acks = []
    p.produce(topic, b"to-new-partition", partition=partition,
              on_delivery=lambda err, m: acks.append((err, m.partition())))
    assert p.flush(30) == 0
    assert acks == [(None, partition)]
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-reader", "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, partition, 0)])
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                return m.partition(), m.offset(), m.value()
    finally:
        c.close()
    raise AssertionError(f"nothing read from {topic}-{partition}")


@pytest.mark.processes
def test_a_topic_grows_and_clients_use_the_new_partition(broker, unique_topic):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    create_topic(admin, unique_topic, 1)
    # a producer that knows the topic with one partition before it grows
    early = Producer({"bootstrap.servers": broker.bootstrap, "topic.metadata.refresh.interval.ms": 500})
    early.produce(unique_topic, b"before", partition=0)
    assert early.flush(30) == 0
    assert grow(admin, unique_topic, 3) is None
    parts = partitions_seen(admin, unique_topic, 3)
    node = next(iter(admin.list_topics(timeout=10).brokers))
    assert {i: p.leader for i, p in parts.items()} == {0: node, 1: node, 2: node}
    # the producer that knew one partition picks the new ones up at its metadata refresh
    acks = []
    deadline = time.monotonic() + 30
    while not acks:
        try:
            early.produce(unique_topic, b"after", partition=2,
                          on_delivery=lambda err, m: acks.append((err, m.partition())))
        except KafkaException as e:  # a partition its metadata does not show yet
            assert e.args[0].code() == KafkaError._UNKNOWN_PARTITION
            assert time.monotonic() < deadline, "the producer never saw partition 2"
            early.poll(0.1)
            continue
        early.flush(30)
    assert acks == [(None, 2)]
    assert produce_and_read(broker.bootstrap, unique_topic, 1) == (1, 0, b"to-new-partition")
    # kafka-python's admin grows it further; the registry keeps the count over a restart
    from kafka import KafkaAdminClient
    from kafka.admin import NewPartitions as KNewPartitions
    k = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        k.create_partitions({unique_topic: KNewPartitions(total_count=4)})
    finally:
        k.close()
    partitions_seen(admin, unique_topic, 4)
    broker.stop()
    broker.start()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    partitions_seen(admin, unique_topic, 4)
    assert produce_and_read(broker.bootstrap, unique_topic, 3) == (3, 0, b"to-new-partition")


@pytest.mark.processes
def test_create_partitions_errors_as_kafka(shared_broker, unique_topic):
    admin = AdminClient({"bootstrap.servers": shared_broker.bootstrap})
    create_topic(admin, unique_topic, 2)
    node = next(iter(admin.list_topics(timeout=10).brokers))
    assert grow(admin, unique_topic, 2) == KafkaError.INVALID_PARTITIONS
    assert grow(admin, unique_topic, 1) == KafkaError.INVALID_PARTITIONS
    assert grow(admin, unique_topic + "-missing", 3) == KafkaError.UNKNOWN_TOPIC_OR_PART
    # one replica per partition: a list of two is refused, as is a broker that does not exist
    assert grow(admin, unique_topic, 3, [[node, node + 1]]) == KafkaError.INVALID_REPLICA_ASSIGNMENT
    assert grow(admin, unique_topic, 3, [[node + 7]]) == KafkaError.INVALID_REPLICA_ASSIGNMENT
    assert grow(admin, unique_topic, 4, [[node]]) == KafkaError.INVALID_REPLICA_ASSIGNMENT
    # validate_only checks and changes nothing
    assert grow(admin, unique_topic, 5, validate_only=True) is None
    assert grow(admin, unique_topic, 2, validate_only=True) == KafkaError.INVALID_PARTITIONS
    assert len(admin.list_topics(unique_topic, timeout=10).topics[unique_topic].partitions) == 2
    assert grow(admin, unique_topic, 4, [[node], [node]]) is None
    assert len(partitions_seen(admin, unique_topic, 4)) == 4


@pytest.mark.processes
def test_cluster_controller_places_the_new_partitions(tmp_path, unique_topic):
    cluster = LocalCluster(tmp_path, 2, proxies=False).start()
    try:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        create_topic(admin, unique_topic, 1)
        partitions_seen(admin, unique_topic, 1)
        assert grow(admin, unique_topic, 5) is None
        parts = partitions_seen(admin, unique_topic, 5)
        leaders = [parts[i].leader for i in range(5)]
        assert set(leaders) == {1, 2}, leaders  # spread over both brokers, as CreateTopics does
        assert grow(admin, unique_topic, 6, [[2]]) is None
        assert partitions_seen(admin, unique_topic, 6)[5].leader == 2
        assert grow(admin, unique_topic, 7, [[9]]) == KafkaError.INVALID_REPLICA_ASSIGNMENT
        assert grow(admin, unique_topic, 6) == KafkaError.INVALID_PARTITIONS
        for p in (1, 4, 5):
            assert produce_and_read(cluster.bootstrap, unique_topic, p) == (p, 0, b"to-new-partition")
        # the controller's metadata log keeps the count over its restart
        cluster.controller.stop()
        cluster.controller.start()
        partitions_seen(admin, unique_topic, 6)
    finally:
        cluster.stop()
