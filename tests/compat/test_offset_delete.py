"""OffsetDelete (API 47) against a real `oncelog serve`, sent by kafka-python's admin
(delete_group_offsets) while a librdkafka consumer is a member of the group: offsets of a topic
the group subscribes to are refused with GROUP_SUBSCRIBED_TO_TOPIC, others deleted; once the
group is empty any of its offsets go; an unknown group is GROUP_ID_NOT_FOUND, an unknown
partition UNKNOWN_TOPIC_OR_PARTITION (Kafka's GroupCoordinator.handleDeleteOffsets)."""
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient
from kafka import TopicPartition as KTP
from kafka import errors as Errors

pytestmark = pytest.mark.processes


def test_offset_delete_as_kafka(shared_broker, unique_topic):
    boot = shared_broker.bootstrap
    subscribed, other, group = unique_topic + "-a", unique_topic + "-b", unique_topic + "-g"
    admin = AdminClient({"bootstrap.servers": boot})
    for f in admin.create_topics([NewTopic(subscribed, 1, 1), NewTopic(other, 2, 1)]).values():
        f.result(30)
    p = Producer({"bootstrap.servers": boot})
    for i in range(5):
        p.produce(subscribed, b"%d" % i, partition=0)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": boot, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([subscribed])
    deadline = time.monotonic() + 30
    while True:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            break
        assert time.monotonic() < deadline, "the consumer never got a record"
    # a member commits for its own topic and, as Kafka allows, for one it does not subscribe to
    c.commit(offsets=[TopicPartition(subscribed, 0, 3), TopicPartition(other, 0, 7)], asynchronous=False)
    k = KafkaAdminClient(bootstrap_servers=boot)
    try:
        result = k.delete_group_offsets(group, [KTP(subscribed, 0), KTP(other, 0), KTP(other, 1),
                                                KTP(unique_topic + "-missing", 0)])
        assert result == {KTP(subscribed, 0): Errors.GroupSubscribedToTopicError,
                          KTP(other, 0): Errors.NoError, KTP(other, 1): Errors.NoError,
                          KTP(unique_topic + "-missing", 0): Errors.UnknownTopicOrPartitionError}
        left = k.list_group_offsets(group)[group]
        assert {tp: o.offset for tp, o in left.items()} == {KTP(subscribed, 0): 3}
        c.close()  # the group is empty now: any of its offsets may go
        assert k.delete_group_offsets(group, [KTP(subscribed, 0)]) == {KTP(subscribed, 0): Errors.NoError}
        assert not k.list_group_offsets(group).get(group)
        with pytest.raises(Errors.GroupIdNotFoundError):
            k.delete_group_offsets(unique_topic + "-no-group", [KTP(subscribed, 0)])
    finally:
        k.close()
