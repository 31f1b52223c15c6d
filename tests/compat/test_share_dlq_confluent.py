"""Dead-letter topics of share groups (KIP-1191) with librdkafka's share consumer (confluent-kafka's
`ShareConsumer`): two members REJECT every fifth record and accept the rest; each rejected
record comes out of the group's dead-letter topic once, with Kafka's `__dlq.errors.*` headers
and (errors.deadletterqueue.copy.record.enable) its key and value, read back with
confluent-kafka's `Consumer`. The topic and the group are set up with librdkafka's admin client
(`ConfigResource.Type.GROUP` for the group's configs), as an operator would."""
from __future__ import annotations

import time

import pytest
from confluent_kafka import AcknowledgeType, Consumer, TopicPartition
from test_share_groups import FAST, Sharer, group_configs, run_until
from test_third_party_clients import create_topic, produce_confluent, values

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.raw_client import RawConnection

pytestmark = pytest.mark.processes

RECORDS = 200


@pytest.fixture
def broker(tmp_path):
    b = BrokerProcess(tmp_path / "data", overrides=FAST).start(timeout_s=90)
    yield b
    b.stop()


def share_version(boot: str, level: int) -> None:
    """kafka-features.sh upgrade --feature share.version=2"""
    mod = entities.module(ApiKey.UPDATE_FEATURES, 1, "request")
    r = RawConnection(boot).call(ApiKey.UPDATE_FEATURES, 1, timeout=10000, validate_only=False, feature_updates=(
        entities.make(mod.FeatureUpdateKey, feature="share.version", max_version_level=level, upgrade_type=1),))
    assert int(r.error_code) == 0


def read_all(boot: str, topic: str, n: int, timeout_s: float = 60) -> list:
    c = Consumer({"bootstrap.servers": boot, "group.id": f"reader-{topic}", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, 0, 0)])
    out: list = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < n:
            assert time.monotonic() < deadline, f"{len(out)} of {n} dead-letter records"
            m = c.poll(0.2)
            if m is not None and not m.error():
                out.append(m)
        _low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        assert high == n, f"{high} records in {topic}, {n} expected"
    finally:
        c.close()
    return out


def test_records_a_share_consumer_rejects_go_to_the_dead_letter_topic_once(broker):
    boot, topic, dlq = broker.bootstrap, "orders", "dlq.orders"
    share_version(boot, 2)
    create_topic(boot, topic, 1)
    create_topic(boot, dlq, 1, **{"errors.deadletterqueue.group.enable": "true"})
    group_configs(boot, topic, share_auto_offset_reset="earliest", errors_deadletterqueue_topic_name=dlq,
                  errors_deadletterqueue_copy_record_enable="true")
    produce_confluent(boot, topic, values(topic, RECORDS))

    def decide(offset: int, _count: int):
        return AcknowledgeType.REJECT if offset % 5 == 0 else AcknowledgeType.ACCEPT

    sharers = [Sharer(f"d{i}", boot, topic, decide).start() for i in range(2)]
    rejected = list(range(0, RECORDS, 5))
    run_until(sharers, lambda: len({o for s in sharers for o in s.confirmed}) >= RECORDS, 120)
    assert all(not s.errors for s in sharers), [s.errors for s in sharers]
    got = read_all(boot, dlq, len(rejected))
    heads = [{k: v.decode() for k, v in (m.headers() or [])} for m in got]
    assert sorted(int(h["__dlq.errors.offset"]) for h in heads) == rejected
    assert {(h["__dlq.errors.topic"], h["__dlq.errors.partition"], h["__dlq.errors.group"],
             h["__dlq.errors.delivery.count"], h["__dlq.errors.message"]) for h in heads} == {
        (topic, "0", topic, "1", "Offset rejected by client.")}
    vals = values(topic, RECORDS)
    assert {int(h["__dlq.errors.offset"]): m.value() for h, m in zip(heads, got)} == {o: vals[o] for o in rejected}
    assert all(m.key() == str(int(h["__dlq.errors.offset"]) % 7).encode() for h, m in zip(heads, got))
