"""Review of issue 14 item 7 (KIP-794) as the Spark writer sees it, without Spark: the writer
partitions keyless rows itself (`_Writer._write_topic`) instead of through the producer's
partitioner, and every write task starts its sticky partition at 0."""
from collections import Counter

import pyarrow as pa
import pytest

from oncelog.client import Consumer, TopicPartition
from oncelog.spark.source import BatchWriter


def _batch(first: int, n: int):
    return pa.record_batch([pa.array([b"%d:" % i + b"." * 100 for i in range(first, first + n)],
                                     pa.binary())], names=["value"])


@pytest.mark.xfail(strict=True, reason=(
    "review1: spark/produce.py _Writer._write_topic starts each task's sticky partition at "
    "(-1 + 1) % n = 0 and switches per Arrow batch, duplicating the partitioner with the bug "
    "item 7 fixed in client/partitioner.py: small tasks all write to partition 0"))
def test_review_small_write_tasks_do_not_all_land_on_partition_0(spark_broker, make_topic):
    topic = make_topic(4)
    writer = BatchWriter({"bootstrap.servers": spark_broker, "topic": topic}, None)
    for task in range(12):                  # 12 tasks of 50 keyless rows (one Arrow batch each)
        writer.write(iter([_batch(task * 50, 50)]))
    with Consumer({"bootstrap.servers": spark_broker}) as c:
        ends = c.end_offsets([TopicPartition(topic, p) for p in range(4)])
    per_partition = Counter({tp.partition: n for tp, n in ends.items()})
    assert sum(per_partition.values()) == 600
    # random first partitions: all 12 tasks on one partition has probability 4 ** -11
    assert per_partition[0] < 600, per_partition
