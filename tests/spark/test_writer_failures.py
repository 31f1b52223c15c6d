"""A write task that fails midway, driven without Spark against a real broker: every record it
handed to the producer is resolved before the task ends, and a task that could not deliver a
record raises instead of returning a commit message."""
import threading

import pyarrow as pa
import pytest

from oncelog.client import AdminClient, Consumer, TopicPartition
from oncelog.spark.options import OncelogSparkError
from oncelog.spark.source import BatchWriter


def _batch(first: int, n: int, size: int = 100):
    return pa.record_batch([pa.array([f"{i}:".encode().ljust(size, b".")
                                      for i in range(first, first + n)], pa.binary())],
                           names=["value"])


def _end(bootstrap, topic, partitions):
    with Consumer({"bootstrap.servers": bootstrap}) as c:
        ends = c.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
    return sum(ends.values())


def _producer_threads():
    return [t for t in threading.enumerate() if t.name == "oncelog-producer" and t.is_alive()]


def test_input_failing_midway_resolves_every_record_handed_over(spark_broker, make_topic):
    topic = make_topic(2)
    before = len(_producer_threads())

    def rows():
        for k in range(3):
            yield _batch(k * 500, 500)
        raise RuntimeError("upstream failed after 1,500 rows")

    writer = BatchWriter({"bootstrap.servers": spark_broker, "topic": topic}, None)
    with pytest.raises(RuntimeError, match="upstream failed"):
        writer.write(rows())
    # the rows handed over were delivered (not dropped with the producer), and the task's
    # producer is closed (Spark reuses the worker process)
    assert _end(spark_broker, topic, 2) == 1500
    assert len(_producer_threads()) == before


def test_a_record_the_broker_refuses_fails_the_task(spark_broker, make_topic):
    topic = make_topic(1)
    with AdminClient({"bootstrap.servers": spark_broker}) as admin:
        admin.alter_configs(topic, {"max.message.bytes": "20000"})
    before = len(_producer_threads())
    batches = [_batch(0, 50), _batch(50, 1, size=50_000), _batch(51, 50)]
    writer = BatchWriter({"bootstrap.servers": spark_broker, "topic": topic}, None)
    with pytest.raises(OncelogSparkError, match="producing to oncelog failed"):
        writer.write(iter(batches))
    assert len(_producer_threads()) == before
