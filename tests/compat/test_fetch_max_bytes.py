"""Fetch's byte limits against a real `oncelog serve` (KIP-74, Kafka's ReplicaManager.readFromLog):
at most max_bytes of records over all partitions and partition_max_bytes from each, except that
the first batch of the first partition with data is returned whole if it is larger, so consumers
always progress. librdkafka test 0082 (fetch.max.bytes) got 19 MB against a 1 MB limit; here the
same with hand-built requests and with confluent-kafka and kafka-python consumers."""
import asyncio
import time

import pytest

from oncelog.client.aio.connection import Connection
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.records import decode_records, iter_batches

pytestmark = pytest.mark.processes

KB = 1000


def create_topic(boot, topic, partitions):
    from confluent_kafka.admin import AdminClient, NewTopic
    a = AdminClient({"bootstrap.servers": boot})
    [f] = a.create_topics([NewTopic(topic, partitions, 1)]).values()
    f.result(10)


def value(partition: int, i: int, size: int) -> bytes:
    head = b"p%d-%d-" % (partition, i)
    return head + b"x" * (size - len(head))


def produce(boot, topic, sizes_by_partition):
    """One record per batch, so that batch sizes are known: {partition: [value sizes]}."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": boot, "batch.num.messages": 1, "linger.ms": 0,
                  "message.max.bytes": 2_000_000})
    for part, sizes in sizes_by_partition.items():
        for i, size in enumerate(sizes):
            p.produce(topic, value=value(part, i, size), partition=part)
    assert p.flush(60) == 0


def fetch(boot, version, topic, offsets, max_bytes, partition_max_bytes):
    """One Fetch for {partition: offset} in that order: {partition: records bytes}."""
    async def go():
        host, port = boot.rsplit(":", 1)
        conn = Connection(host, int(port), "fetch-max-bytes-test")
        await conn.connect(10)
        try:
            rq = entities.RequestBuilder(ApiKey.FETCH, version)
            parts = tuple(rq("FetchPartition", partition=p, current_leader_epoch=-1, fetch_offset=o,
                             last_fetched_epoch=-1, log_start_offset=-1,
                             partition_max_bytes=partition_max_bytes) for p, o in offsets.items())
            req = rq.encode(replica_id=-1, max_wait=0, min_bytes=1, max_bytes=max_bytes,
                            isolation_level=0, session_id=0, session_epoch=-1,
                            topics=(rq("FetchTopic", topic=topic, partitions=parts),),
                            forgotten_topics_data=(), rack_id="")
            body = await asyncio.wait_for(conn.request(ApiKey.FETCH, version, req), 30)
            r = entities.decode_response(ApiKey.FETCH, version, body)
            out = {}
            for t in r.responses:
                for p in t.partitions:
                    assert p.error_code == 0, p
                    out[p.partition_index] = bytes(p.records or b"")
            return out
        finally:
            conn.close()
    return asyncio.run(go())


def whole_batches(records: bytes) -> list:
    spans = [(pos, pos + h.size) for pos, h in iter_batches(records, strict=True)]
    assert (spans[-1][1] if spans else 0) == len(records), "a partial batch was returned"
    return spans


@pytest.mark.parametrize("version", [4, 12])
def test_max_bytes_bounds_the_response_over_many_partitions(shared_broker, unique_topic, version):
    partitions, per_partition, size = 6, 5, 100 * KB
    create_topic(shared_broker.bootstrap, unique_topic, partitions)
    produce(shared_broker.bootstrap, unique_topic, {p: [size] * per_partition for p in range(partitions)})
    max_bytes = 350 * KB
    first = fetch(shared_broker.bootstrap, version, unique_topic, {p: 0 for p in range(partitions)},
                  max_bytes, 10_000_000)
    assert sum(map(len, first.values())) <= max_bytes
    # the first partition fills what it can with whole batches; the next batch does not fit
    assert len(whole_batches(first[0])) == 3 and all(first[p] == b"" for p in range(1, partitions))

    # a consumer's loop: every response within the limit, every record read once, in order
    offsets = {p: 0 for p in range(partitions)}
    read = {p: [] for p in range(partitions)}
    for _round in range(partitions * per_partition):
        if all(o == per_partition for o in offsets.values()):
            break
        got = fetch(shared_broker.bootstrap, version, unique_topic, offsets, max_bytes, 10_000_000)
        assert 0 < sum(map(len, got.values())) <= max_bytes
        for p, records in got.items():
            whole_batches(records)
            for r in decode_records(records):
                if r.offset >= offsets[p]:
                    read[p].append(r.value)
                    offsets[p] = r.offset + 1
    assert read == {p: [value(p, i, size) for i in range(per_partition)] for p in range(partitions)}


def test_a_batch_larger_than_the_limits_is_returned_whole_only_first(shared_broker, unique_topic):
    create_topic(shared_broker.bootstrap, unique_topic, 2)
    produce(shared_broker.bootstrap, unique_topic, {0: [600 * KB], 1: [600 * KB]})
    boot, both = shared_broker.bootstrap, {0: 0, 1: 0}
    # above max_bytes: the first partition's batch whole, nothing from the second
    got = fetch(boot, 12, unique_topic, both, 100 * KB, 10_000_000)
    assert len(whole_batches(got[0])) == 1 and len(got[0]) > 600 * KB and got[1] == b""
    # above partition_max_bytes: the same
    got = fetch(boot, 12, unique_topic, both, 10_000_000, 100 * KB)
    assert len(whole_batches(got[0])) == 1 and got[1] == b""
    # the second partition's batch comes whole once it is the first with data
    got = fetch(boot, 12, unique_topic, {0: 1, 1: 0}, 100 * KB, 100 * KB)
    assert got[0] == b"" and [r.value for r in decode_records(got[1])] == [value(1, 0, 600 * KB)]


def consume_confluent(boot, topic, partitions, expected):
    from confluent_kafka import Consumer, TopicPartition
    # librdkafka refuses a response above receive.message.max.bytes, which must be at least
    # fetch.max.bytes + 512: a broker that overshoots fetch.max.bytes stalls this consumer
    c = Consumer({"bootstrap.servers": boot, "group.id": "unused-with-assign", "enable.auto.commit": False,
                  "fetch.max.bytes": 300 * KB, "receive.message.max.bytes": 300 * KB + 512,
                  "message.max.bytes": 200 * KB})  # librdkafka wants fetch.max.bytes >= it
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out, deadline = [], time.monotonic() + 60
    while len(out) < expected and time.monotonic() < deadline:
        for m in c.consume(100, 0.5):
            assert m.error() is None, m.error()
            out.append((m.partition(), m.offset(), m.value()))
    c.close()
    return out


def consume_kafka_python(boot, topic, partitions, expected):
    from kafka import KafkaConsumer, TopicPartition
    c = KafkaConsumer(bootstrap_servers=boot, enable_auto_commit=False, auto_offset_reset="earliest",
                      fetch_max_bytes=300 * KB)
    c.assign([TopicPartition(topic, p) for p in range(partitions)])
    out, deadline = [], time.monotonic() + 60
    while len(out) < expected and time.monotonic() < deadline:
        for _tp, msgs in c.poll(500).items():
            out += [(m.partition, m.offset, m.value) for m in msgs]
    c.close()
    return out


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_consumers_with_a_small_fetch_max_bytes_read_everything(shared_broker, unique_topic, client):
    sizes = {p: [100 * KB] * 8 for p in range(3)}
    if client == "kafka-python":
        sizes[1][4] = 600 * KB  # larger than fetch_max_bytes: it must still come, whole
    create_topic(shared_broker.bootstrap, unique_topic, 3)
    produce(shared_broker.bootstrap, unique_topic, sizes)
    expected = sorted((p, i, value(p, i, s)) for p, ss in sizes.items() for i, s in enumerate(ss))
    consume = consume_confluent if client == "confluent" else consume_kafka_python
    assert sorted(consume(shared_broker.bootstrap, unique_topic, 3, len(expected))) == expected


def test_the_broker_caps_what_a_request_may_ask(tmp_path):
    """fetch.max.bytes (broker, Kafka's name and default 55 MiB) bounds any request's MaxBytes."""
    from oncelog.testing.embedded import BrokerProcess
    with BrokerProcess(tmp_path / "data", {"fetch.max.bytes": "250000"}) as b:
        create_topic(b.bootstrap, "capped", 1)
        produce(b.bootstrap, "capped", {0: [100 * KB] * 5})
        got = fetch(b.bootstrap, 12, "capped", {0: 0}, 2**31 - 1, 2**31 - 1)
        assert len(whole_batches(got[0])) == 2 and len(got[0]) <= 250_000
