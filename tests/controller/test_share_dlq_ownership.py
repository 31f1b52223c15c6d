"""Dead letters (KIP-1191) follow the share group's lease, never a broker's memory: broker 1
coordinates the group and leads its topic, but not the dead-letter partition, so the records a
member rejects there stay owed (ARCHIVING, their dead letters in the group's state). Broker 1 is
paused (SIGSTOP) past its session; broker 2 takes the topic and the group over, finds the dead
letters in the state and writes them. Broker 1 resumes, still holding them in memory, and the
dead-letter partition is moved to it: it must not write them again (it lost the group's lease; a
write of the same producer, epoch and sequences would be refused as well). One dead-letter record
per rejected record.

Every wait polls with a deadline; the pause is a real SIGSTOP/SIGCONT of the broker process."""
from __future__ import annotations

import os
import signal

import pytest
from confluent_kafka import Consumer, TopicPartition
from test_pause_fencing import Raw, create_topic, eventually, place_group, topics
from test_share_group_ownership import ACK, TOPIC, Sharer, cluster, leads, topic_id  # noqa: F401 - fixture

from oncelog.client import Producer
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E

pytestmark = pytest.mark.processes

DLQ, GROUP, REJECT = "dlq.sharers", "sharers", 3


def configure(raw: Raw) -> None:
    mod = entities.module(ApiKey.UPDATE_FEATURES, 1, "request")
    u = raw.call(ApiKey.UPDATE_FEATURES, 1, timeout=30000, validate_only=False, feature_updates=(
        entities.make(mod.FeatureUpdateKey, feature="share.version", max_version_level=2, upgrade_type=1),))
    assert int(u.error_code) == E.NONE, u
    res = entities.nested(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "request", "AlterConfigsResource")
    cfg = entities.nested(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "request", "AlterableConfig")
    topic = raw.call(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, validate_only=False, resources=(res(
        resource_type=2, resource_name=DLQ, configs=(
            cfg(name="errors.deadletterqueue.group.enable", config_operation=0, value="true"),)),))
    assert topic.responses[0].error_code.value == E.NONE, topic
    r = raw.call(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, validate_only=False, resources=(res(
        resource_type=32, resource_name=GROUP, configs=(
            cfg(name="share.auto.offset.reset", config_operation=0, value="earliest"),
            cfg(name="errors.deadletterqueue.topic.name", config_operation=0, value=DLQ))),))
    assert r.responses[0].error_code.value == E.NONE, r


def dead_letter_offsets(bootstrap: str) -> list[int]:
    """The source offsets of every record of dlq.sharers-0."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "dlq-reader", "enable.auto.commit": False,
                  "log_level": 3})
    try:
        _low, high = c.get_watermark_offsets(TopicPartition(DLQ, 0), timeout=10)
        c.assign([TopicPartition(DLQ, 0, 0)])
        out: list[int] = []
        while len(out) < high:
            m = c.poll(5)
            assert m is not None, f"{len(out)} of {high} records read"
            if not m.error():
                out.append(int(dict(m.headers() or [])["__dlq.errors.offset"]))
        return out
    finally:
        c.close()


def test_dead_letters_are_written_once_by_the_owner_of_the_group(cluster):  # noqa: F811 - the imported fixture
    b1 = Raw(cluster.brokers[1].bootstrap)
    create_topic(b1, TOPIC, 1)
    create_topic(b1, DLQ, 1)
    with Producer({"bootstrap.servers": cluster.bootstrap}) as p:
        for i in range(10):
            p.send(TOPIC, f"r{i}".encode(), partition=0)
        p.flush()
    tid = topic_id(b1, TOPIC)
    place_group(cluster, b1, GROUP, 1)
    assert cluster.move_leader(TOPIC, 0, 1) == 0 and cluster.move_leader(DLQ, 0, 2) == 0
    eventually(lambda: leads(b1, 1, GROUP) and topics(b1)[DLQ][0][0] == 2, "broker 1 coordinating, broker 2 the DLQ")
    configure(b1)

    a = Sharer(b1, GROUP, tid)
    assert a.join() == E.NONE
    eventually(lambda: a.fetch(10)[1] == list(range(10)), "member A holding the records")
    assert a.acknowledge(list(range(5)), REJECT) == E.NONE   # broker 1 does not lead dlq.sharers-0: owed
    assert dead_letter_offsets(cluster.bootstrap) == []

    os.kill(cluster.brokers[1].proc.pid, signal.SIGSTOP)
    try:
        b2 = Raw(cluster.brokers[2].bootstrap)
        eventually(lambda: leads(b2, 2, GROUP), "broker 2 taking the partition and the group over", timeout_s=60)
        # broker 2 finds the dead letters in the group's state without a consumer asking
        eventually(lambda: sorted(dead_letter_offsets(cluster.bootstrap)) == list(range(5)),
                   "broker 2 writing the dead letters", timeout_s=60, every_s=0.5)
    finally:
        os.kill(cluster.brokers[1].proc.pid, signal.SIGCONT)

    b1 = Raw(cluster.brokers[1].bootstrap)
    eventually(lambda: cluster.move_leader(DLQ, 0, 1) == 0, "moving the dead-letter partition to broker 1")
    eventually(lambda: topics(b1)[DLQ][0][0] == 1, "broker 1 leading the dead-letter partition")
    # broker 1 answers for the group no more (it dropped the group it held when its lease was lost):
    # from then on nothing of it can be written from its memory
    stale = Sharer(b1, GROUP, tid)
    eventually(lambda: stale.join() == E.NOT_COORDINATOR, "broker 1 no longer coordinating the group")
    assert sorted(dead_letter_offsets(cluster.bootstrap)) == list(range(5))
