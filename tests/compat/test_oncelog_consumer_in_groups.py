"""oncelog's Consumer as a member of consumer groups beside confluent-kafka (librdkafka) members,
with the KIP-848 protocol and with the classic one: the group splits the partitions between the
two clients, partitions that move are committed first (on_revoke and auto-commit), every record
is read once. And oncelog's own commits: explicit, of a message, of what poll returned,
asynchronous with on_commit; `enable.auto.commit`'s at-least-once; the protocol chosen by what the
broker serves."""
from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from test_consumer_protocol import FAST_GROUPS, Member, wait_for
from test_third_party_clients import create_topic, produce_confluent, values

from oncelog.client import Consumer
from oncelog.client.types import ConsumerGroupMetadata, TopicPartition
from oncelog.testing.embedded import BrokerProcess

pytestmark = pytest.mark.processes

GROUPS = {**FAST_GROUPS, "group.consumer.min.session.timeout.ms": "2000", "group.consumer.session.timeout.ms": "4000"}


@pytest.fixture(scope="module")
def groups_broker(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("groups") / "data", overrides=GROUPS).start()
    yield b
    b.stop()


class OncelogMember:
    """oncelog's Consumer in a thread, shaped like test_consumer_protocol.Member."""

    def __init__(self, name: str, bootstrap: str, group: str, topic: str, **config) -> None:
        self.name, self.topic = name, topic
        self.config = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                       "client.id": name, **config}
        self.read: list[bytes] = []
        self.events: list[tuple[float, str, frozenset[int]]] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> OncelogMember:
        self.thread.start()
        return self

    def owned(self) -> set[int]:
        owned: set[int] = set()
        for _t, kind, ps in list(self.events):
            owned = owned | ps if kind == "assign" else owned - ps
        return owned

    def _run(self) -> None:
        try:
            c = Consumer(self.config)
            c.subscribe([self.topic],
                        on_assign=lambda _c, ps: self.events.append((time.monotonic(), "assign",
                                                                     frozenset(p.partition for p in ps))),
                        on_revoke=lambda _c, ps: self.events.append((time.monotonic(), "revoke",
                                                                     frozenset(p.partition for p in ps))))
            while not self.stop.is_set():
                self.read += [r.value for r in c.poll(0.2)]
            c.close()
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.errors.append(f"{type(e).__name__}: {e}")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive()


@pytest.mark.parametrize("protocol", ["consumer", "classic"])
def test_oncelog_and_confluent_members_share_a_group_and_read_each_record_once(groups_broker, unique_topic, protocol):
    boot = groups_broker.bootstrap
    create_topic(boot, unique_topic, 6)
    produce_confluent(boot, unique_topic, values("m", 12_000))
    confluent_config = {} if protocol == "consumer" else {"group.protocol": "classic",
                                                           "partition.assignment.strategy": "range"}
    a = Member("confluent-a", boot, unique_topic, unique_topic, config=confluent_config, delay_s=0.0005)
    if protocol == "classic":
        a.config = {**a.config, "group.protocol": "classic"}
    a.start()
    wait_for(lambda: len(a.read) >= 2000, "the first member to read")
    o = OncelogMember("oncelog", boot, unique_topic, unique_topic, **{"group.protocol": protocol}).start()
    wait_for(lambda: o.owned(), "oncelog's consumer to be given partitions")
    wait_for(lambda: len(a.read) + len(o.read) >= 12_000, "every record", timeout_s=120)
    time.sleep(1)
    a.close()
    o.close()
    everything = Counter(a.read + o.read)
    assert [v for v, n in everything.items() if n > 1] == []
    assert set(everything) == set(values("m", 12_000))
    assert o.read and a.read
    assert not o.errors and not a.errors and not a.commit_errors


def test_auto_commit_is_at_least_once(groups_broker, unique_topic):
    """What poll returned is committed by the next auto-commit; a consumer that dies before it
    leaves its last records to be read again by its successor, and nothing else."""
    boot = groups_broker.bootstrap
    create_topic(boot, unique_topic, 2)
    produce_confluent(boot, unique_topic, values("first", 500))
    config = {"bootstrap.servers": boot, "group.id": unique_topic, "auto.offset.reset": "earliest",
              "auto.commit.interval.ms": 300}
    c = Consumer(config)
    c.subscribe([unique_topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < 500 and time.monotonic() < deadline:
        got += [r.value for r in c.poll(0.2)]
    end = time.monotonic() + 1
    while time.monotonic() < end:      # idle polls: the auto-commit of everything returned
        got += [r.value for r in c.poll(0.1)]
    assert sorted(got) == sorted(values("first", 500))
    assert sum(tp.offset for tp in c.committed([TopicPartition(unique_topic, p) for p in range(2)])) == 500
    produce_confluent(boot, unique_topic, values("second", 300))
    last: list[bytes] = []
    while not last:
        last = [r.value for r in c.poll(1.0)]
    c._lt.stop()                        # dies: no close, no commit of `last`
    c2 = Consumer(config)
    c2.subscribe([unique_topic])
    again: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(again) < 300 and time.monotonic() < deadline:
        again += [r.value for r in c2.poll(0.2)]
    c2.close()
    assert sorted(again) == sorted(values("second", 300))    # nothing lost, the first 500 not again
    assert set(last) <= set(again)


def test_commits_explicit_of_a_message_and_asynchronous(groups_broker, unique_topic):
    boot = groups_broker.bootstrap
    create_topic(boot, unique_topic, 2)
    produce_confluent(boot, unique_topic, values("c", 100))
    outcomes: list = []
    c = Consumer({"bootstrap.servers": boot, "group.id": unique_topic, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "on_commit": lambda err, ps: outcomes.append((err, ps))})
    c.subscribe([unique_topic])
    records = []
    deadline = time.monotonic() + 30
    while len(records) < 100 and time.monotonic() < deadline:
        records += c.poll(0.2)
    tps = [TopicPartition(unique_topic, p) for p in range(2)]
    assert [tp.offset for tp in c.committed(tps)] == [None, None]
    last = records[-1]
    assert c.commit(message=last, asynchronous=False) == [TopicPartition(last.topic, last.partition, last.offset + 1)]
    c.commit(offsets=[TopicPartition(unique_topic, 0, 3), TopicPartition(unique_topic, 1, 4)])  # asynchronous
    wait_for(lambda: outcomes, "the asynchronous commit's outcome")
    assert outcomes == [(None, [TopicPartition(unique_topic, 0, 3), TopicPartition(unique_topic, 1, 4)])]
    assert [tp.offset for tp in c.committed(tps)] == [3, 4]
    committed = c.commit(asynchronous=False)                  # every position poll returned
    ends = c.end_offsets(tps)
    assert {tp.partition: tp.offset for tp in committed} == {tp.partition: ends[tp] for tp in tps}
    c.close()


def test_a_transactions_group_metadata_is_the_one_its_records_were_polled_under(groups_broker, unique_topic):
    """What `consumer_group_metadata` says changes only at the next poll, as Java's consumer
    shows the application its group: a member fenced and rejoined in the background since the
    poll (a paused client, issue 34) must send the records' offsets with the epoch it polled them
    under, which the coordinator refuses if the partitions are no longer its own, not with its
    new epoch, which it would take."""
    boot = groups_broker.bootstrap
    create_topic(boot, unique_topic, 2)
    produce_confluent(boot, unique_topic, values("g", 20))
    c = Consumer({"bootstrap.servers": boot, "group.id": unique_topic, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([unique_topic])
    try:
        records: list = []
        deadline = time.monotonic() + 30
        while not records and time.monotonic() < deadline:
            records += c.poll(0.2)
        polled = c.consumer_group_metadata()
        assert records and polled.generation_id > 0
        # the membership rejoined in the background at a new epoch, as after a fence
        rejoined = ConsumerGroupMetadata(polled.group_id, polled.generation_id + 5, polled.member_id)
        c._impl.group.metadata = lambda: rejoined
        assert c.consumer_group_metadata() == polled
        c.poll(0.1)
        assert c.consumer_group_metadata() == rejoined
    finally:
        c.close()


def test_the_classic_protocol_where_the_broker_serves_no_other(tmp_path, unique_topic):
    from confluent_kafka import ConsumerGroupType
    from confluent_kafka.admin import AdminClient
    b = BrokerProcess(tmp_path / "data", overrides={"group.coordinator.rebalance.protocols": "classic"}).start()
    try:
        create_topic(b.bootstrap, unique_topic, 2)
        produce_confluent(b.bootstrap, unique_topic, values("p", 50))
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": unique_topic, "auto.offset.reset": "earliest"})
        c.subscribe([unique_topic])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 50 and time.monotonic() < deadline:
            got += c.poll(0.2)
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        listed = admin.list_consumer_groups().result(30).valid
        assert [g.type for g in listed if g.group_id == unique_topic] == [ConsumerGroupType.CLASSIC]
        c.close()
        assert len(got) == 50
    finally:
        b.stop()
