"""Write tasks and the driver's marker writes reuse one producer per process (spark/producers.py),
seen from the broker: the producer ids a partition holds state for. Without Spark: each write()
or commit() call stands for a task or a micro-batch commit in the same Python worker. This is the
at-least-once path (`deliveryGuarantee=at-least-once`); exactly-once tasks each have their own
transactional id, hence producer id (docs/spark.md)."""
import pyarrow as pa

from oncelog.client import AdminClient
from oncelog.spark.source import BatchWriter, StreamWriter, TaskCommit


def _producer_ids(bootstrap, topic):
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        return {p["producer_id"] for p in admin.describe_producers(topic, 0)}


def test_tasks_of_one_worker_write_with_one_producer_id(spark_broker, make_topic):
    topic = make_topic(1)
    writer = BatchWriter({"bootstrap.servers": spark_broker, "topic": topic,
                          "deliveryGuarantee": "at-least-once"}, None)
    for task in range(5):
        writer.write(iter([pa.record_batch([pa.array([b"t%d-%d" % (task, i) for i in range(10)])],
                                           names=["value"])]))
    assert len(_producer_ids(spark_broker, topic)) == 1


def test_driver_marker_writes_use_one_producer_id(spark_broker, make_topic):
    markers = make_topic(1)
    options = {"bootstrap.servers": spark_broker, "topic": "unused", "commitTopic": markers,
               "deliveryGuarantee": "at-least-once"}
    for batch in range(4):
        # Spark makes a new writer for each micro-batch's commit, in its sink runner process
        StreamWriter(options, None).commit([TaskCommit("s", batch, 0, 0, 3, fingerprint="f")],
                                           batch)
    StreamWriter(options, None).abort([TaskCommit("s", 4, 0, 0, 3, fingerprint="f"), None], 4)
    assert len(_producer_ids(spark_broker, markers)) == 1
