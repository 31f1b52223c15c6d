"""KIP-430's authorized-operations fields against a real `oncelog serve` without an authorizer,
asked by confluent-kafka's AdminClient (librdkafka 0081's DescribeConsumerGroups, DescribeTopics
and DescribeCluster with include_authorized_operations): the full set of each resource type's
operations (Kafka's AclEntry.supportedOperations) when asked, nothing when not."""
import time

import pytest
from confluent_kafka import Consumer, TopicCollection
from confluent_kafka.admin import AclOperation, AdminClient, NewTopic

pytestmark = pytest.mark.processes

TOPIC_OPERATIONS = {AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DESCRIBE,
                    AclOperation.DELETE, AclOperation.ALTER, AclOperation.DESCRIBE_CONFIGS,
                    AclOperation.ALTER_CONFIGS}
GROUP_OPERATIONS = {AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE,
                    AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}
CLUSTER_OPERATIONS = {AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
                      AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER,
                      AclOperation.DESCRIBE}


def test_full_operation_sets_without_an_authorizer(shared_broker, unique_topic):
    admin = AdminClient({"bootstrap.servers": shared_broker.bootstrap})
    admin.create_topics([NewTopic(unique_topic, 1, 1)])[unique_topic].result(30)

    cluster = admin.describe_cluster(include_authorized_operations=True).result(10)
    assert set(cluster.authorized_operations) == CLUSTER_OPERATIONS
    assert admin.describe_cluster().result(10).authorized_operations is None

    [f] = admin.describe_topics(TopicCollection([unique_topic]), include_authorized_operations=True).values()
    assert set(f.result(10).authorized_operations) == TOPIC_OPERATIONS
    [f] = admin.describe_topics(TopicCollection([unique_topic])).values()
    assert f.result(10).authorized_operations is None

    group = unique_topic + "-g"
    c = Consumer({"bootstrap.servers": shared_broker.bootstrap, "group.id": group})
    c.subscribe([unique_topic])
    deadline = time.monotonic() + 30
    while not c.assignment():
        assert time.monotonic() < deadline, "the consumer never joined"
        c.poll(0.2)
    try:
        [f] = admin.describe_consumer_groups([group], include_authorized_operations=True).values()
        assert set(f.result(10).authorized_operations) == GROUP_OPERATIONS
        [f] = admin.describe_consumer_groups([group]).values()
        assert f.result(10).authorized_operations is None
    finally:
        c.close()
