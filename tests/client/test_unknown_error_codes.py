"""Error codes this client does not know (a newer broker's, or garbage) are errors carrying their
number wherever they arrive — InitProducerId, Produce, Metadata, Fetch — never a ValueError in
the sender that leaves it waiting forever. librdkafka's mock answers with the injected code."""
import pytest

from oncelog.client import Consumer, Producer, TopicPartition
from oncelog.client.errors import BrokerResponseError, IdempotenceUnsupportedError, KafkaClientError, ProducerFatalError
from oncelog.protocol.errors import ErrorCode as E

INIT_PRODUCER_ID, PRODUCE, FETCH = 22, 0, 1
UNKNOWN = 9999


def test_error_code_maps_unknown_numbers_to_a_named_value():
    from oncelog.protocol.errors import error_code
    assert error_code(6) is E.NOT_LEADER_OR_FOLLOWER
    c = error_code(UNKNOWN)
    assert c == UNKNOWN and c.name == "UNKNOWN_ERROR_9999" and c.value == UNKNOWN
    assert str(BrokerResponseError(UNKNOWN, "boom")) == "UNKNOWN_ERROR_9999: boom"


def test_required_fails_at_start_on_an_unknown_init_producer_id_error(rdkafka_mock):
    rdkafka_mock.push_errors(INIT_PRODUCER_ID, UNKNOWN)
    with pytest.raises(IdempotenceUnsupportedError, match="UNKNOWN_ERROR_9999"):
        Producer({"bootstrap.servers": rdkafka_mock.bootstrap, "enable.idempotence": "required",
                  "max.block.ms": 5000})


def test_requested_falls_back_on_an_unknown_init_producer_id_error(rdkafka_mock):
    rdkafka_mock.create_topic("m", 1)
    rdkafka_mock.push_errors(INIT_PRODUCER_ID, UNKNOWN)
    with Producer({"bootstrap.servers": rdkafka_mock.bootstrap, "enable.idempotence": "requested",
                   "max.block.ms": 5000, "linger.ms": 0}) as p:
        futs = [p.send("m", b"%d" % i) for i in range(20)]
        p.flush(10)
        assert [f.result(1).offset for f in futs] == list(range(20))
        assert not p.idempotent


def test_unknown_error_on_an_epoch_bump_is_fatal_not_a_wedge(rdkafka_mock):
    rdkafka_mock.create_topic("m", 1)
    with Producer({"bootstrap.servers": rdkafka_mock.bootstrap, "enable.idempotence": "required",
                   "linger.ms": 0, "request.timeout.ms": 2000, "delivery.timeout.ms": 5000}) as p:
        assert p.send("m", b"0").result(10).offset == 0
        # the batch right after the acknowledged one is out of order: bump the epoch. Bumps are
        # local (KIP-360) until the epoch is exhausted, so start at the last epoch: the bump asks
        # for a new producer id, which the broker refuses with a code we do not know
        p.aio.core.producer_epoch = 32767
        rdkafka_mock.push_errors(PRODUCE, E.OUT_OF_ORDER_SEQUENCE_NUMBER)
        rdkafka_mock.push_errors(INIT_PRODUCER_ID, UNKNOWN)
        with pytest.raises(ProducerFatalError, match="UNKNOWN_ERROR_9999"):
            p.send("m", b"1").result(10)


def test_unknown_produce_error_fails_that_batch_with_its_number(rdkafka_mock):
    rdkafka_mock.create_topic("m", 1)
    with Producer({"bootstrap.servers": rdkafka_mock.bootstrap, "linger.ms": 0}) as p:
        p.partitions_for("m")
        rdkafka_mock.push_errors(PRODUCE, UNKNOWN)
        with pytest.raises(BrokerResponseError, match="UNKNOWN_ERROR_9999") as e:
            p.send("m", b"a").result(10)
        assert e.value.code == UNKNOWN
        assert p.send("m", b"b").result(10).offset == 0


def test_unknown_topic_error_in_metadata_is_a_client_error(rdkafka_mock):
    rdkafka_mock.create_topic("m", 1)
    rdkafka_mock.set_topic_error("m", UNKNOWN)
    with Producer({"bootstrap.servers": rdkafka_mock.bootstrap, "max.block.ms": 5000}) as p:
        with pytest.raises(KafkaClientError, match="UNKNOWN_ERROR_9999"):
            p.send("m", b"a")


def test_unknown_fetch_error_is_retried(rdkafka_mock):
    rdkafka_mock.create_topic("m", 1)
    with Producer({"bootstrap.servers": rdkafka_mock.bootstrap}) as p:
        p.send("m", b"a").result(10)
    with Consumer({"auto.offset.reset": "earliest", "bootstrap.servers": rdkafka_mock.bootstrap}) as c:
        c.assign([TopicPartition("m", 0, 0)])
        rdkafka_mock.push_errors(FETCH, UNKNOWN)
        got = []
        for _ in range(20):
            got += c.poll(0.5)
            if got:
                break
        assert [r.value for r in got] == [b"a"]


def test_unknown_fetch_error_on_one_partition_leaves_the_others_readable():
    """A newer broker's code for one partition of a Fetch response is that partition's error: the
    other partitions' records are delivered (a whole-response failure would stall every partition
    the broker leads)."""
    from oncelog.client.aio.consumer import AIOConsumer
    from oncelog.protocol import fetch
    from oncelog.protocol.records import Record, encode_batch
    c = AIOConsumer({"auto.offset.reset": "earliest", "bootstrap.servers": "127.0.0.1:1"})
    c.assign([TopicPartition("m", 0, 0), TopicPartition("m", 1, 0)])
    records = encode_batch([Record(0, 1000, None, b"a"), Record(1, 1000, None, b"b")])
    for version in (4, 11, 12):
        c.positions = {TopicPartition("m", 0): 0, TopicPartition("m", 1): 0}
        c._on_fetch_response(version, fetch.encode_response(version, [("m", [
            fetch.PartitionData(0, UNKNOWN), fetch.PartitionData(1, 0, 2, 0, records)])]))
        assert [(r.partition, r.value) for r in c.buffer] == [(1, b"a"), (1, b"b")]
        assert c.positions == {TopicPartition("m", 0): 0, TopicPartition("m", 1): 2}
        c.buffer.clear()
