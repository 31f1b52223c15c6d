"""Client quotas against a real `oncelog serve` (KIP-13, KIP-219): set with AlterClientQuotas, read
back with DescribeClientQuotas, enforced on a librdkafka producer that tries to go faster than its
`producer_byte_rate`: the broker answers with throttle_time_ms and mutes the connection, and the
rate the producer achieves is the quota's, within 20%.

`quota.window.num=2` (Kafka's setting, default 11) makes the quota's rate a one-to-two-second
average, so a few seconds of producing show the steady state; with 11 windows Kafka lets a new
client burst ten windows' worth first."""
from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from test_authorization import call

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.testing.embedded import BrokerProcess

pytestmark = pytest.mark.processes

QUOTA = 100_000          # bytes/s
WARMUP_S, MEASURE_S = 2.0, 6.0


def alter_quota(bootstrap: str, entity: list[tuple[str, str | None]], key: str, value: float,
                remove: bool = False, version: int = 1):
    q = entities.RequestBuilder(ApiKey.ALTER_CLIENT_QUOTAS, version)
    return call(bootstrap, ApiKey.ALTER_CLIENT_QUOTAS, version, validate_only=False, entries=(
        q("EntryData", entity=tuple(q("EntityData", entity_type=t, entity_name=n) for t, n in entity),
          ops=(q("OpData", key=key, value=value, remove=remove),)),))


@pytest.fixture
def quota_broker(tmp_path):
    with BrokerProcess(tmp_path / "data", {"quota.window.num": "2"}) as b:
        yield b


def test_quotas_are_stored_and_described(quota_broker):
    r = alter_quota(quota_broker.bootstrap, [("user", "ANONYMOUS")], "producer_byte_rate", QUOTA)
    assert [e.error_code.value for e in r.entries] == [0]
    r = alter_quota(quota_broker.bootstrap, [("client-id", None)], "consumer_byte_rate", 2.5)
    assert r.entries[0].error_code.value == 42            # INVALID_REQUEST: a byte rate is whole
    c = entities.RequestBuilder(ApiKey.DESCRIBE_CLIENT_QUOTAS, 1)
    d = call(quota_broker.bootstrap, ApiKey.DESCRIBE_CLIENT_QUOTAS, 1, strict=False,
             components=(c("ComponentData", entity_type="user", match_type=0, match="ANONYMOUS"),))
    assert d.error_code.value == 0
    assert [(e.entity[0].entity_name, [(v.key, v.value) for v in e.values]) for e in d.entries] == [
        ("ANONYMOUS", [("producer_byte_rate", float(QUOTA))])]


def test_producer_over_its_byte_rate_is_throttled_to_the_quota(quota_broker):
    boot = quota_broker.bootstrap
    topic = f"quota-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": boot})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(20)
    r = alter_quota(boot, [("user", "ANONYMOUS")], "producer_byte_rate", QUOTA)
    assert r.entries[0].error_code.value == 0
    acked: list[tuple[float, int]] = []

    def delivered(err, msg):
        assert err is None, err
        acked.append((time.monotonic(), len(msg.value())))

    # a short queue: what is left at the end drains at the quota
    p = Producer({"bootstrap.servers": boot, "linger.ms": 5, "batch.size": 16384, "acks": 1,
                  "queue.buffering.max.messages": 200})
    value = b"x" * 1000
    start = time.monotonic()
    while time.monotonic() - start < WARMUP_S + MEASURE_S:
        try:
            p.produce(topic, value, on_delivery=delivered)
        except BufferError:
            p.poll(0.05)
            continue
        p.poll(0)
    p.flush(30)
    window = [n for t, n in acked if start + WARMUP_S <= t < start + WARMUP_S + MEASURE_S]
    rate = sum(window) / MEASURE_S
    print(f"achieved {rate:.0f} B/s against a quota of {QUOTA} B/s ({rate / QUOTA:.2f}x)")
    assert 0.8 * QUOTA <= rate <= 1.2 * QUOTA


def test_consumer_over_its_byte_rate_is_throttled_to_the_quota(quota_broker):
    from confluent_kafka import Consumer, TopicPartition

    boot = quota_broker.bootstrap
    topic = f"quota-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": boot})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(20)
    # batches well below what the quota allows in its window: a Fetch returns at least one whole
    # batch, and one larger than that window would be throttled every time (as in Kafka)
    p = Producer({"bootstrap.servers": boot, "linger.ms": 20, "batch.size": 16384})
    value = b"y" * 1000
    for _ in range(int(QUOTA * (WARMUP_S + MEASURE_S + 4) / len(value))):   # more than the run can read
        while True:
            try:
                p.produce(topic, value)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0
    r = alter_quota(boot, [("user", "ANONYMOUS")], "consumer_byte_rate", QUOTA)
    assert r.entries[0].error_code.value == 0
    # small fetches, as the producer's small batches: the quota is a rate over one-second windows
    c = Consumer({"bootstrap.servers": boot, "group.id": "unused", "enable.auto.commit": False,
                  "max.partition.fetch.bytes": 16384})
    c.assign([TopicPartition(topic, 0, 0)])
    read: list[tuple[float, int]] = []
    start = time.monotonic()
    try:
        while time.monotonic() - start < WARMUP_S + MEASURE_S:
            for m in c.consume(500, 0.2):
                assert m.error() is None, m.error()
                read.append((time.monotonic(), len(m.value())))
    finally:
        c.close()
    window = [n for t, n in read if start + WARMUP_S <= t < start + WARMUP_S + MEASURE_S]
    rate = sum(window) / MEASURE_S
    print(f"consumed {rate:.0f} B/s against a quota of {QUOTA} B/s ({rate / QUOTA:.2f}x)")
    assert 0.8 * QUOTA <= rate <= 1.2 * QUOTA
