"""A share group's state follows its coordinator's lease (issue 37 with issue 34's fault): a broker
that lost a share group (paused past its session, the group taken over by another broker) and got
it back later serves it from the files, never from what it held in memory before.

Broker 1 coordinates the share group and leads the topic's partition. Member A accepts records
0-9 there. Broker 1 is paused (SIGSTOP) past its session: the controller moves the partition and
the group to broker 2, where member B accepts 10-19. Broker 1 resumes, and the partition and the
group are moved back to it. Member C must then get 20-29, and nothing of 0-19 again: before,
broker 1 still held the share-partition as it left it (10-29 available) and, once the store had
read the file again, wrote that over broker 2's state and handed out 10-19 a second time.

Every wait polls with a deadline; the pause is a real SIGSTOP/SIGCONT of the broker process."""
from __future__ import annotations

import os
import signal
import time
import uuid

import pytest
from test_pause_fencing import OFFSETS_PARTITIONS, Raw, coordinator, create_topic, eventually, place_group, topics

from oncelog.client import Producer, ShareConsumer
from oncelog.core.txn.log_format import CONSUMER_OFFSETS_TOPIC, partition_for
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing.cluster import LocalCluster

pytestmark = pytest.mark.processes

HB, FETCH, ACK = ApiKey.SHARE_GROUP_HEARTBEAT, ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE
ACCEPT, RECORD_LIMIT = 1, 1   # an acknowledgement type; ShareFetch v2's ShareAcquireMode
TOPIC, RECORDS = "work", 30


@pytest.fixture
def cluster(tmp_path):
    c = LocalCluster(tmp_path, 2, {}, proxies=False).start()
    yield c
    for b in c.brokers.values():
        if b.running:
            os.kill(b.proc.pid, signal.SIGCONT)
    c.stop()


def topic_id(raw: Raw, name: str) -> uuid.UUID:
    r = raw.call(ApiKey.METADATA, 12, topics=None, allow_auto_topic_creation=False,
                 include_topic_authorized_operations=False)
    return next(t.topic_id for t in r.topics if str(t.name) == name)


class Sharer:
    """One share-group member speaking to one broker with raw requests."""

    def __init__(self, raw: Raw, group: str, tid: uuid.UUID) -> None:
        self.raw, self.group, self.tid = raw, group, tid
        self.member_id, self.session_epoch = str(uuid.uuid4()), 0

    def join(self) -> int:
        r = self.raw.call(HB, 1, group_id=self.group, member_id=self.member_id, member_epoch=0, rack_id=None,
                          subscribed_topic_names=(TOPIC,))
        return r.error_code.value

    def fetch(self, max_records: int) -> tuple[int, list[int]]:
        """(partition 0's error code, the offsets acquired)."""
        fp = entities.nested(FETCH, 2, "request", "FetchPartition")
        ft = entities.nested(FETCH, 2, "request", "FetchTopic")
        partition = fp(partition_index=0, acknowledgement_batches=())
        r = self.raw.call(FETCH, 2, group_id=self.group, member_id=self.member_id,
                          share_session_epoch=self.session_epoch, max_wait=500, min_bytes=1, max_bytes=1 << 20,
                          max_records=max_records, batch_size=max_records, share_acquire_mode=RECORD_LIMIT,
                          is_renew_ack=False, topics=(ft(topic_id=self.tid, partitions=(partition,)),),
                          forgotten_topics_data=())
        assert r.error_code.value == E.NONE, r
        self.session_epoch += 1
        p = r.responses[0].partitions[0]
        return p.error_code.value, [o for a in p.acquired_records
                                    for o in range(int(a.first_offset), int(a.last_offset) + 1)]

    def accept(self, offsets: list[int]) -> int:
        return self.acknowledge(offsets, ACCEPT)

    def acknowledge(self, offsets: list[int], kind: int) -> int:
        """ShareAcknowledge of min(offsets)..max(offsets) as `kind`: the partition's error code."""
        ab = entities.nested(ACK, 1, "request", "AcknowledgementBatch")
        ap = entities.nested(ACK, 1, "request", "AcknowledgePartition")
        at = entities.nested(ACK, 1, "request", "AcknowledgeTopic")
        r = self.raw.call(ACK, 1, group_id=self.group, member_id=self.member_id,
                          share_session_epoch=self.session_epoch, topics=(at(topic_id=self.tid, partitions=(
                              ap(partition_index=0, acknowledgement_batches=(
                                  ab(first_offset=min(offsets), last_offset=max(offsets),
                                     acknowledge_types=(kind,)),)),)),))
        assert r.error_code.value == E.NONE, r
        self.session_epoch += 1
        return r.responses[0].partitions[0].error_code.value

    def take(self, count: int) -> list[int]:
        """Records until `count` were acquired (record mode: at most what is asked), all accepted."""
        got: list[int] = []

        def more() -> bool:
            code, offsets = self.fetch(count - len(got))
            # (each retriable: a client asks again)
            assert code in (E.NONE, E.NOT_LEADER_OR_FOLLOWER, E.KAFKA_STORAGE_ERROR), code
            got.extend(offsets)
            return len(got) >= count
        eventually(more, f"{count} records for {self.member_id}", every_s=0.2)
        assert self.accept(got) == E.NONE
        return got


def read_from_the_start(raw: Raw, group: str) -> int:
    """IncrementalAlterConfigs of the group: share.auto.offset.reset=earliest; its error code."""
    res = entities.nested(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "request", "AlterConfigsResource")
    cfg = entities.nested(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "request", "AlterableConfig")
    r = raw.call(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, resources=(res(resource_type=32, resource_name=group, configs=(
        cfg(name="share.auto.offset.reset", config_operation=0, value="earliest"),)),), validate_only=False)
    return r.responses[0].error_code.value


def offsets_answers(raw: Raw, group: str) -> tuple[tuple[int, dict], int, int]:
    """DescribeShareGroupOffsets ((group error, {partition: start offset})), and the top-level
    codes of an AlterShareGroupOffsets and a DeleteShareGroupOffsets of TOPIC, at one broker."""
    dg = entities.nested(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 1, "request", "DescribeShareGroupOffsetsRequestGroup")
    d = raw.call(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 1, groups=(dg(group_id=group, topics=None),)).groups[0]
    at = entities.nested(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, "request", "AlterShareGroupOffsetsRequestTopic")
    ap = entities.nested(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, "request", "AlterShareGroupOffsetsRequestPartition")
    a = raw.call(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, group_id=group, topics=(
        at(topic_name=TOPIC, partitions=(ap(partition_index=0, start_offset=0),)),))
    dt = entities.nested(ApiKey.DELETE_SHARE_GROUP_OFFSETS, 0, "request", "DeleteShareGroupOffsetsRequestTopic")
    x = raw.call(ApiKey.DELETE_SHARE_GROUP_OFFSETS, 0, group_id=group, topics=(dt(topic_name=TOPIC),))
    return ((d.error_code.value, {int(p.partition_index): int(p.start_offset) for t in d.topics for p in t.partitions}),
            a.error_code.value, x.error_code.value)


def leads(raw: Raw, broker: int, group: str) -> bool:
    return coordinator(raw, group, 0) == broker and topics(raw).get(TOPIC, [(-1, -1)])[0][0] == broker


def test_a_broker_that_gets_a_share_group_back_serves_it_from_the_files(cluster):
    b1 = Raw(cluster.brokers[1].bootstrap)
    group = "sharers"
    create_topic(b1, TOPIC, 1)
    with Producer({"bootstrap.servers": cluster.bootstrap}) as p:
        for i in range(RECORDS):
            p.send(TOPIC, f"r{i}".encode(), partition=0)
        p.flush()
    tid = topic_id(b1, TOPIC)
    place_group(cluster, b1, group, 1)
    assert cluster.move_leader(TOPIC, 0, 1) == 0
    eventually(lambda: leads(b1, 1, group), "broker 1 leading the partition and coordinating the group")
    # a group's configs are changed at its coordinator (another broker: NOT_COORDINATOR, not a
    # handler bug's UNKNOWN_SERVER_ERROR as before)
    assert read_from_the_start(Raw(cluster.brokers[2].bootstrap), group) == E.NOT_COORDINATOR
    assert read_from_the_start(b1, group) == E.NONE

    a = Sharer(b1, group, tid)
    assert a.join() == E.NONE
    assert a.take(10) == list(range(10))

    os.kill(cluster.brokers[1].proc.pid, signal.SIGSTOP)
    try:
        b2 = Raw(cluster.brokers[2].bootstrap)
        eventually(lambda: leads(b2, 2, group), "broker 2 taking the partition and the group over", timeout_s=60)
        b = Sharer(b2, group, tid)
        eventually(lambda: b.join() == E.NONE, "member B joining at broker 2")
        assert b.take(10) == list(range(10, 20))
    finally:
        os.kill(cluster.brokers[1].proc.pid, signal.SIGCONT)

    b1 = Raw(cluster.brokers[1].bootstrap)   # the paused broker's old connection is gone or stale
    # the group's offsets are its coordinator's: broker 1, whose lease was taken while it was
    # paused, answers NOT_COORDINATOR (before anything from memory); broker 2 has B's acceptances
    # and refuses to change the offsets of a group with a member
    assert offsets_answers(b1, group) == ((E.NOT_COORDINATOR, {}), E.NOT_COORDINATOR, E.NOT_COORDINATOR)
    assert offsets_answers(Raw(cluster.brokers[2].bootstrap), group) == (
        (E.NONE, {0: 20}), E.NON_EMPTY_GROUP, E.NON_EMPTY_GROUP)
    eventually(lambda: cluster.move_leader(CONSUMER_OFFSETS_TOPIC, partition_for(group, OFFSETS_PARTITIONS), 1) == 0
               and cluster.move_leader(TOPIC, 0, 1) == 0, "moving the group and the partition back to broker 1")
    eventually(lambda: leads(b1, 1, group), "broker 1 leading and coordinating again")
    c = Sharer(b1, group, tid)
    eventually(lambda: c.join() == E.NONE, "member C joining at broker 1")
    got = c.take(10)
    assert got == list(range(20, 30)), f"broker 1 handed out {got}: records accepted before were delivered again"


def test_an_oncelog_member_follows_the_share_partition_to_its_new_broker_without_spinning(cluster):
    """Issue 37: a member whose partition and group moved to another broker kept asking the old
    one. Its background metadata refresh after a NOT_LEADER_OR_FOLLOWER named no topic (the
    topics were never kept in the client's wanted set), so it never learned the new leader, and
    it asked again at once, without backing off: hundreds of ShareFetch a second answered
    NOT_LEADER_OR_FOLLOWER, and no record for the rest of the run (`oncelog verify --workload
    share --faults kill,pause,move,power-loss --seed 7`). It must get the records from the new
    broker, having backed off between the answers it got meanwhile."""
    b1 = Raw(cluster.brokers[1].bootstrap)
    group = "followers"
    create_topic(b1, TOPIC, 1)
    place_group(cluster, b1, group, 1)
    assert cluster.move_leader(TOPIC, 0, 1) == 0
    eventually(lambda: leads(b1, 1, group), "broker 1 leading the partition and coordinating the group")
    assert read_from_the_start(b1, group) == E.NONE

    def produce(first: int) -> None:
        with Producer({"bootstrap.servers": cluster.bootstrap}) as p:
            for i in range(first, first + 10):
                p.send(TOPIC, f"r{i}".encode(), partition=0)
            p.flush()

    def take(member: ShareConsumer, count: int) -> list[int]:
        got: list[int] = []

        def more() -> bool:
            got.extend(r.offset for r in member.poll(0.2))
            member.commit_sync()
            return len(got) >= count
        eventually(more, f"{count} records", timeout_s=30, every_s=0)
        return got

    produce(0)
    member = ShareConsumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "fetch.max.wait.ms": 200})
    try:
        member.subscribe([TOPIC])
        assert sorted(take(member, 10)) == list(range(10))
        b2 = Raw(cluster.brokers[2].bootstrap)
        eventually(lambda: cluster.move_leader(CONSUMER_OFFSETS_TOPIC, partition_for(group, OFFSETS_PARTITIONS), 2)
                   == 0 and cluster.move_leader(TOPIC, 0, 2) == 0, "moving the group and the partition to broker 2")
        eventually(lambda: leads(b2, 2, group), "broker 2 leading and coordinating")
        produce(10)
        began = time.monotonic()
        assert sorted(take(member, 10)) == list(range(10, 20))
        took = time.monotonic() - began
        misled = member._impl.fetch_errors[E.NOT_LEADER_OR_FOLLOWER]
        # retry.backoff.ms (100) between two of them: at most about ten a second, plus a few
        assert misled <= 10 * took + 5, f"{misled} NOT_LEADER_OR_FOLLOWER answers in {took:.1f} s: no back-off"
    finally:
        member.close()
