"""Unmodified third-party clients against a real `oncelog serve`: confluent-kafka (librdkafka),
kafka-python and aiokafka create topics, produce idempotently, and consume what any of them wrote."""
import asyncio
import time

import pytest

N = 10_000


def values(prefix: str, n: int = N) -> list[bytes]:
    return [f"{prefix}-{i:06d}".encode() for i in range(n)]


# ----------------------------------------------------------------- producers (each returns acks)

def produce_confluent(boot, topic, vals, idempotent=True):
    from confluent_kafka import Producer
    acks = []
    p = Producer({"bootstrap.servers": boot, "enable.idempotence": idempotent, "linger.ms": 2})
    for i, v in enumerate(vals):
        p.produce(topic, value=v, key=str(i % 7).encode(),
                  on_delivery=lambda err, m: acks.append((err, m.partition(), m.offset(), m.value())))
        p.poll(0)
    assert p.flush(30) == 0
    assert [a for a in acks if a[0] is not None] == []
    return [(part, off, v) for _e, part, off, v in acks]


def produce_kafka_python(boot, topic, vals, idempotent=True):
    from kafka import KafkaProducer
    p = KafkaProducer(bootstrap_servers=boot, enable_idempotence=idempotent, acks="all", linger_ms=2)
    futures = [(p.send(topic, v, key=str(i % 7).encode()), v) for i, v in enumerate(vals)]
    p.flush(30)
    out = []
    for f, v in futures:
        md = f.get(10)
        out.append((md.partition, md.offset, v))
    p.close()
    return out


def produce_aiokafka(boot, topic, vals, idempotent=True):
    from aiokafka import AIOKafkaProducer

    async def go():
        p = AIOKafkaProducer(bootstrap_servers=boot, enable_idempotence=idempotent, linger_ms=2)
        await p.start()
        try:
            futs = [(await p.send(topic, v, key=str(i % 7).encode()), v) for i, v in enumerate(vals)]
            out = []
            for f, v in futs:
                md = await f
                out.append((md.partition, md.offset, v))
            return out
        finally:
            await p.stop()
    return asyncio.run(asyncio.wait_for(go(), 60))


PRODUCERS = {"confluent": produce_confluent, "kafka-python": produce_kafka_python,
             "aiokafka": produce_aiokafka}


# ----------------------------------------------------------------- consumers (partition, offset, value)

def consume_confluent(boot, topic, partitions, expected):
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": boot, "group.id": "unused-with-assign", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out, deadline = [], time.monotonic() + 30
    while len(out) < expected and time.monotonic() < deadline:
        for m in c.consume(1000, 0.5):
            assert m.error() is None, m.error()
            out.append((m.partition(), m.offset(), m.value()))
    c.close()
    return out


def consume_kafka_python(boot, topic, partitions, expected):
    from kafka import KafkaConsumer, TopicPartition
    c = KafkaConsumer(bootstrap_servers=boot, enable_auto_commit=False, auto_offset_reset="earliest")
    c.assign([TopicPartition(topic, p) for p in range(partitions)])
    out, deadline = [], time.monotonic() + 30
    while len(out) < expected and time.monotonic() < deadline:
        for msgs in c.poll(500).values():
            out += [(m.partition, m.offset, m.value) for m in msgs]
    c.close()
    return out


def consume_aiokafka(boot, topic, partitions, expected):
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def go():
        c = AIOKafkaConsumer(bootstrap_servers=boot, enable_auto_commit=False, auto_offset_reset="earliest")
        await c.start()
        try:
            c.assign([TopicPartition(topic, p) for p in range(partitions)])
            out, deadline = [], time.monotonic() + 30
            while len(out) < expected and time.monotonic() < deadline:
                for msgs in (await c.getmany(timeout_ms=500)).values():
                    out += [(m.partition, m.offset, m.value) for m in msgs]
            return out
        finally:
            await c.stop()
    return asyncio.run(go())


CONSUMERS = {"confluent": consume_confluent, "kafka-python": consume_kafka_python,
             "aiokafka": consume_aiokafka}


def create_topic(boot, topic, partitions, **configs):
    from confluent_kafka.admin import AdminClient, NewTopic
    a = AdminClient({"bootstrap.servers": boot})
    [f] = a.create_topics([NewTopic(topic, partitions, 1, config={k: str(v) for k, v in configs.items()})]).values()
    f.result(10)


def assert_exact(acked, consumed):
    """Every acknowledged value is read once, at the offset it was acknowledged with, in offset
    order within each partition, and each partition's offsets are contiguous from 0."""
    assert len(consumed) == len(acked), (len(consumed), len(acked))
    assert sorted(acked) == sorted(consumed)
    for part in {p for p, _o, _v in consumed}:
        offs = [o for p, o, _v in consumed if p == part]
        assert offs == sorted(offs), f"partition {part} read out of order"
    by_part = {}
    for part, off, _v in consumed:
        by_part.setdefault(part, []).append(off)
    for offs in by_part.values():
        assert sorted(offs) == list(range(len(offs)))


@pytest.mark.parametrize("producer", list(PRODUCERS))
def test_each_client_reads_what_each_idempotent_producer_wrote(shared_broker, unique_topic, producer):
    """10,000 records over 3 partitions; every consumer gets each once, in order, at its offset."""
    create_topic(shared_broker.bootstrap, unique_topic, 3)
    acked = PRODUCERS[producer](shared_broker.bootstrap, unique_topic, values(producer))
    assert len(acked) == N
    for consume in CONSUMERS.values():
        assert_exact(acked, consume(shared_broker.bootstrap, unique_topic, 3, len(acked)))


@pytest.mark.parametrize("producer", list(PRODUCERS))
def test_order_per_key_is_kept(shared_broker, unique_topic, producer):
    create_topic(shared_broker.bootstrap, unique_topic, 2)
    vals = values("o", 600)
    acked = PRODUCERS[producer](shared_broker.bootstrap, unique_topic, vals)
    consumed = consume_confluent(shared_broker.bootstrap, unique_topic, 2, len(acked))
    # values with the same key go to one partition in send order
    for key in range(7):
        sent = [v for i, v in enumerate(vals) if i % 7 == key]
        got = [v for _p, _o, v in sorted(consumed) if v in set(sent)]
        assert got == sent


def test_acknowledged_records_survive_kill_9(broker, unique_topic):
    create_topic(broker.bootstrap, unique_topic, 2)
    acked = produce_confluent(broker.bootstrap, unique_topic, values("crash", 3000))
    broker.kill()
    broker.start()
    assert_exact(acked, consume_kafka_python(broker.bootstrap, unique_topic, 2, len(acked)))
    more = produce_confluent(broker.bootstrap, unique_topic, values("after", 100))
    assert min(off for _p, off, _v in more) >= 0
    assert_exact(acked + more, consume_confluent(broker.bootstrap, unique_topic, 2, len(acked) + 100))


def test_auto_created_topic_on_first_metadata(shared_broker, unique_topic):
    acked = produce_kafka_python(shared_broker.bootstrap, unique_topic, values("auto", 50))
    assert {p for p, _o, _v in acked} == {0}
    assert_exact(acked, consume_aiokafka(shared_broker.bootstrap, unique_topic, 1, 50))


def test_admin_clients_describe_configs_and_delete_topics(shared_broker, unique_topic):
    from confluent_kafka.admin import AdminClient, ConfigResource
    create_topic(shared_broker.bootstrap, unique_topic, 1, **{"retention.ms": 60000,
                                                               "producer.state.batches.to.retain": 20})
    a = AdminClient({"bootstrap.servers": shared_broker.bootstrap})
    [f] = a.describe_configs([ConfigResource("topic", unique_topic)]).values()
    configs = f.result(10)
    assert configs["retention.ms"].value == "60000"
    assert configs["producer.state.batches.to.retain"].value == "20"
    assert configs["message.format.version"].value == "3.0"
    from kafka import KafkaAdminClient
    k = KafkaAdminClient(bootstrap_servers=shared_broker.bootstrap)
    k.delete_topics([unique_topic])
    k.close()
    deadline = time.monotonic() + 10
    while unique_topic in a.list_topics(timeout=5).topics and time.monotonic() < deadline:
        time.sleep(0.05)
    assert unique_topic not in a.list_topics(timeout=5).topics


def test_torn_tail_written_by_hand_is_truncated_with_a_log_line(broker, unique_topic):
    create_topic(broker.bootstrap, unique_topic, 1)
    acked = produce_confluent(broker.bootstrap, unique_topic, values("torn", 500))
    broker.kill()
    [segment] = sorted((broker.data_dir / f"{unique_topic}-0").glob("*.log"))[-1:]
    whole = segment.stat().st_size
    with open(segment, "ab") as f:
        # the first 40 bytes of a batch header: a write cut short by the crash
        f.write(b"\x00" * 8 + (5000).to_bytes(4, "big") + b"\x00" * 28)
    broker.start()
    assert segment.stat().st_size == whole
    assert "truncat" in broker.log_tail().lower()
    assert_exact(acked, consume_aiokafka(broker.bootstrap, unique_topic, 1, len(acked)))
    more = produce_kafka_python(broker.bootstrap, unique_topic, values("next", 10))
    assert [o for _p, o, _v in more] == list(range(500, 510))
