"""Review of issue 14 item 7 (KIP-794) as the Spark writer sees it, without Spark: the writer
partitions keyless rows itself (`_Writer._write_topic`) instead of through the producer's
partitioner, and every write task starts its sticky partition at 0."""
from collections import Counter

import pyarrow as pa

from oncelog.client import Consumer, TopicPartition
from oncelog.spark import producers
from oncelog.spark.source import BatchWriter


def _batch(first: int, n: int):
    return pa.record_batch([pa.array([b"%d:" % i + b"." * 100 for i in range(first, first + n)],
                                     pa.binary())], names=["value"])


def test_review_small_write_tasks_do_not_all_land_on_partition_0(spark_broker, make_topic):
    topic = make_topic(4)
    # the shared idempotent producer's partitioning (exactly-once tasks have producers of their own)
    writer = BatchWriter({"bootstrap.servers": spark_broker, "topic": topic,
                          "deliveryGuarantee": "at-least-once"}, None)
    for task in range(12):                  # 12 tasks of 50 keyless rows (one Arrow batch each)
        writer.write(iter([_batch(task * 50, 50)]))
        producers.close_all()               # ...each in a Python worker of its own
    with Consumer({"auto.offset.reset": "earliest", "bootstrap.servers": spark_broker}) as c:
        ends = c.end_offsets([TopicPartition(topic, p) for p in range(4)])
    per_partition = Counter({tp.partition: n for tp, n in ends.items()})
    assert sum(per_partition.values()) == 600
    # random first partitions: all 12 tasks on one partition has probability 4 ** -11
    assert per_partition[0] < 600, per_partition


def test_tasks_sharing_a_producer_move_on_after_batch_size_bytes(spark_broker, make_topic):
    """Tasks of one Python worker share its producer and so its sticky partition: KIP-794 moves
    keyless rows to another partition after each batch.size bytes, whichever task sends them."""
    topic = make_topic(4)
    writer = BatchWriter({"bootstrap.servers": spark_broker, "topic": topic,
                          "kafka.batch.size": "2048", "deliveryGuarantee": "at-least-once"}, None)
    for task in range(12):
        writer.write(iter([_batch(task * 50, 50)]))
    with Consumer({"auto.offset.reset": "earliest", "bootstrap.servers": spark_broker}) as c:
        ends = c.end_offsets([TopicPartition(topic, p) for p in range(4)])
    per_partition = Counter({tp.partition: n for tp, n in ends.items()})
    assert sum(per_partition.values()) == 600
    # ~40 stays of 2 KB over 4 partitions: one left out has probability 4 * 0.75 ** 40
    assert min(per_partition[p] for p in range(4)) > 0, per_partition
