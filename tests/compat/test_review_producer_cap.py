"""Review of the producer cap (i13-pstate) with a client nobody here wrote: the broker refused a
new producer with THROTTLING_QUOTA_EXCEEDED, which docs/producer-state.md called retriable;
librdkafka fails the message at once (Kafka never sends this code on Produce)."""
import pytest

from oncelog.client import AdminClient


# review1: at producer.state.max.producers.per.partition the broker refused new producers with
# THROTTLING_QUOTA_EXCEEDED, which librdkafka (confluent-kafka 2.16) fails at once as permanent.
# Now the least recently updated producer is evicted (into the remembered set) instead.
def test_review_librdkafka_producer_on_a_full_partition_is_retried_not_failed(broker):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    with AdminClient({"bootstrap.servers": broker.bootstrap}) as admin:
        admin.create_topics(["capped"], config={"producer.state.max.producers.per.partition": "1"})["capped"].result()
    errors = []

    def report(err, _msg):
        errors.append(err)
    first = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    first.produce("capped", b"a", on_delivery=report)
    assert first.flush(30) == 0 and errors == [None]
    second = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True,
                                       "message.timeout.ms": 10_000})
    second.produce("capped", b"b", on_delivery=report)
    assert second.flush(30) == 0
    # the report comes at once, THROTTLING_QUOTA_EXCEEDED as a permanent failure (not retried
    # for message.timeout.ms): with the cap as it is, every librdkafka producer that starts
    # while the partition is full loses its messages
    assert errors[1] is None, (errors[1], errors[1].retriable())
