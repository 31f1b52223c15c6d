"""A write task that fails midway, driven without Spark against a real broker: every record it
handed to the producer is resolved before the task ends, and a task that could not deliver a
record raises instead of returning a commit message. Tasks share their Python worker's producer
(spark/producers.py): one that failed a delivery is replaced, a healthy one serves the next task.
The shared producer is the at-least-once path; an exactly-once task has its own transactional
producer, and its failure aborts its transaction."""
import threading

import pyarrow as pa
import pytest

from oncelog.client import AdminClient, Consumer, TopicPartition
from oncelog.spark import producers
from oncelog.spark.options import OncelogSparkError, write_options
from oncelog.spark.source import BatchWriter


def _batch(first: int, n: int, size: int = 100):
    return pa.record_batch([pa.array([f"{i}:".encode().ljust(size, b".")
                                      for i in range(first, first + n)], pa.binary())],
                           names=["value"])


def _end(bootstrap, topic, partitions):
    with Consumer({"auto.offset.reset": "earliest", "bootstrap.servers": bootstrap}) as c:
        ends = c.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
    return sum(ends.values())


def _producer_threads():
    return [t for t in threading.enumerate() if t.name == "oncelog-producer" and t.is_alive()]


def test_input_failing_midway_resolves_every_record_handed_over(spark_broker, make_topic):
    topic = make_topic(2)
    options = {"bootstrap.servers": spark_broker, "topic": topic,
               "deliveryGuarantee": "at-least-once"}
    before = len(_producer_threads())

    def rows():
        # batches of 100 rows (about 11 KB) fit the topic's max.message.bytes: this task fails
        # by the upstream error alone, whenever the broker answers
        for k in range(15):
            yield _batch(k * 100, 100)
        raise RuntimeError("upstream failed after 1,500 rows")

    writer = BatchWriter(options, None)
    with pytest.raises(RuntimeError, match="upstream failed"):
        writer.write(rows())
    # the rows handed over were delivered before the task ended, not left in flight for the
    # next task of this process to inherit
    assert _end(spark_broker, topic, 2) == 1500
    shared = producers.shared(write_options(options).client)
    assert len(_producer_threads()) <= before + 1
    # the next task of the same worker process produces through the same producer (no new
    # producer id for each task)
    pid = shared.aio.core.producer_id
    writer.write(iter([_batch(1500, 10)]))
    assert _end(spark_broker, topic, 2) == 1510
    assert producers.shared(write_options(options).client) is shared
    assert shared.aio.core.producer_id == pid
    assert len(_producer_threads()) <= before + 1


def test_a_record_the_broker_refuses_fails_the_task(spark_broker, make_topic):
    topic = make_topic(1)
    options = {"bootstrap.servers": spark_broker, "topic": topic,
               "deliveryGuarantee": "at-least-once"}
    with AdminClient({"bootstrap.servers": spark_broker}) as admin:
        admin.alter_configs(topic, {"max.message.bytes": "20000"})
    failing = producers.shared(write_options(options).client)
    before = len(_producer_threads())
    batches = [_batch(0, 50), _batch(50, 1, size=50_000), _batch(51, 50)]
    writer = BatchWriter(options, None)
    with pytest.raises(OncelogSparkError, match="producing to oncelog failed"):
        writer.write(iter(batches))
    # the producer that failed a delivery is closed and the next task gets another
    assert len(_producer_threads()) == before - 1
    assert producers.shared(write_options(options).client) is not failing


def test_exactly_once_task_failing_midway_leaves_nothing_visible(spark_broker, make_topic):
    """The task's records were handed to its transactional producer; the upstream error aborts
    the transaction (none of them visible to read_committed, none left open) before it goes
    on, and a record the broker refuses fails the task the same way."""
    topic = make_topic(2)
    with AdminClient({"bootstrap.servers": spark_broker}) as admin:
        admin.alter_configs(topic, {"max.message.bytes": "20000"})
    options = {"bootstrap.servers": spark_broker, "topic": topic}
    before = len(_producer_threads())

    def rows():
        # batches of 100 rows (about 11 KB) fit the topic's max.message.bytes: this task fails
        # by the upstream error alone, whenever the broker answers
        for k in range(15):
            yield _batch(k * 100, 100)
        raise RuntimeError("upstream failed after 1,500 rows")

    with pytest.raises(RuntimeError, match="upstream failed"):
        BatchWriter(options, None).write(rows())
    with pytest.raises(OncelogSparkError, match="producing to oncelog failed"):
        BatchWriter(options, None).write(iter([_batch(0, 50), _batch(50, 1, size=50_000)]))
    assert len(_producer_threads()) == before        # each task's producer is closed
    tps = [TopicPartition(topic, p) for p in range(2)]
    with Consumer({"auto.offset.reset": "earliest",
                   "bootstrap.servers": spark_broker, "isolation.level": "read_committed"}) as c, \
            Consumer({"auto.offset.reset": "earliest", "bootstrap.servers": spark_broker}) as uncommitted:
        # the last stable offset is the high watermark: no transaction is left open
        assert c.end_offsets(tps) == uncommitted.end_offsets(tps)
        c.assign([TopicPartition(topic, p, 0) for p in range(2)])
        assert [r for _ in range(3) for r in c.poll(0.3)] == []
