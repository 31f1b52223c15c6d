"""KIP-848 consumer groups with librdkafka (confluent-kafka, `group.protocol=consumer`): the broker
assigns, members reconcile incrementally. Judged from outside: the records each member reads, and
the rebalance callbacks librdkafka calls (with the consumer protocol every callback is
incremental: on_assign adds partitions, on_revoke takes some away, on_lost drops all).

The broker runs with a 500 ms heartbeat interval (Kafka's minimum is 5 s; the settings allow less)
so that rebalances take a few heartbeats of a test's time, not of a production's."""
from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from test_kafkajs import kafkajs, run_node, unexpected_errors  # noqa: F401  (kafkajs: a fixture)
from test_third_party_clients import create_topic, produce_confluent, values

from oncelog.protocol.api import ApiKey
from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.raw_client import RawConnection

pytestmark = pytest.mark.processes

FAST_GROUPS = {"group.consumer.min.heartbeat.interval.ms": "100", "group.consumer.heartbeat.interval.ms": "500",
               "group.consumer.min.session.timeout.ms": "3000", "group.consumer.session.timeout.ms": "10000"}
PARTITIONS = 6


@pytest.fixture(scope="module")
def kip848_broker(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("kip848") / "data", overrides=FAST_GROUPS).start()
    yield b
    b.stop()


@dataclass
class Member:
    """One confluent-kafka consumer in a thread: what it read and every callback it saw."""
    name: str
    bootstrap: str
    group: str
    topic: str
    config: dict = field(default_factory=dict)
    delay_s: float = 0.0                      # per record: keeps a member busy while others join
    read: list[bytes] = field(default_factory=list)
    events: list[tuple[float, str, frozenset[int]]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    commit_errors: list[str] = field(default_factory=list)   # commits refused or cut off (a broker restart)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def owned(self) -> set[int]:
        owned: set[int] = set()
        for _t, kind, ps in list(self.events):
            if kind == "assign":
                owned |= ps
            else:
                owned -= ps
        return owned

    def kinds(self, since: float = 0.0, until: float = float("inf")) -> list[tuple[str, frozenset[int]]]:
        """The callbacks that changed something (librdkafka also calls on_assign with no
        partitions when a reconciliation added none)."""
        return [(k, ps) for t, k, ps in list(self.events) if since <= t < until and ps]

    def start(self) -> Member:
        self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group, "group.protocol": "consumer",
                      "auto.offset.reset": "earliest", "enable.auto.commit": False, "client.id": self.name,
                      **self.config})

        def on_assign(consumer, ps):
            self.events.append((time.monotonic(), "assign", frozenset(p.partition for p in ps)))

        def on_revoke(consumer, ps):
            # what was read of the partitions given up is committed before they go (the next
            # owner starts there): the usual pattern for exactly-once reading without transactions
            positions = [p for p in consumer.position(ps) if p.offset >= 0]
            if positions:
                self._commit(consumer, positions)
            self.events.append((time.monotonic(), "revoke", frozenset(p.partition for p in ps)))

        def on_lost(consumer, ps):
            self.events.append((time.monotonic(), "lost", frozenset(p.partition for p in ps)))

        c.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
        try:
            since_commit = 0
            while not self.stop.is_set():
                m = c.poll(0.1)
                if m is None:
                    continue
                if m.error() is not None:
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        self.errors.append(str(m.error()))
                    continue
                self.read.append(m.value())
                since_commit += 1
                if since_commit >= 200:
                    self._commit(c)
                    since_commit = 0
                if self.delay_s:
                    time.sleep(self.delay_s)
            if since_commit:
                self._commit(c)
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.errors.append(f"{type(e).__name__}: {e}")
        finally:
            c.close()  # leaves the group (epoch -1)

    def _commit(self, consumer, offsets=None) -> None:
        try:
            if offsets is None:
                consumer.commit(asynchronous=False)
            else:
                consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as e:
            # _NO_OFFSET: nothing consumed since the assignment changed (an eager rebalance took
            # every partition back between the last record and this commit); nothing was refused
            if e.args[0].code() != KafkaError._NO_OFFSET:
                self.commit_errors.append(e.args[0].name())

    def close(self, timeout_s: float = 30) -> None:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), f"{self.name} did not close"


def wait_for(condition, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def split(members: list[Member]) -> bool:
    """Every partition owned by exactly one member, each member owning some."""
    owned = [m.owned() for m in members]
    return (all(owned) and sum(map(len, owned)) == PARTITIONS
            and set().union(*owned) == set(range(PARTITIONS)))


def describe(bootstrap: str, group: str):
    """ConsumerGroupDescribe v1 as a tool would send it."""
    conn = RawConnection(bootstrap)
    try:
        return conn.call(ApiKey.CONSUMER_GROUP_DESCRIBE, 1, group_ids=(group,),
                         include_authorized_operations=False).groups[0]
    finally:
        conn.sock.close()


def test_three_consumers_read_30000_records_exactly_once(kip848_broker, unique_topic):
    """Members join one by one while the first ones read: partitions move twice, each after its
    owner committed what it read, so no record is read twice and none is missed."""
    boot = kip848_broker.bootstrap
    create_topic(boot, unique_topic, PARTITIONS)
    produce_confluent(boot, unique_topic, values("x", 30_000))
    members = [Member(n, boot, unique_topic, unique_topic, delay_s=0.0003) for n in ("a", "b", "c")]
    members[0].start()
    wait_for(lambda: len(members[0].read) >= 3000, "a to read")
    members[1].start()
    wait_for(lambda: members[1].owned(), "b to be given partitions")
    members[2].start()
    wait_for(lambda: sum(len(m.read) for m in members) >= 30_000, "every record", timeout_s=120)
    wait_for(lambda: split(members), "the partitions split over the three")
    time.sleep(1)  # anything read twice would arrive now
    for m in members:
        m.close()
    everything = Counter(v for m in members for v in m.read)
    assert sum(everything.values()) == 30_000, [v for v, n in everything.items() if n > 1][:10]
    assert set(everything) == set(values("x", 30_000))
    assert all(m.read for m in members), [len(m.read) for m in members]
    assert not [e for m in members for e in m.errors + m.commit_errors]
    assert not [k for m in members for k, _ps in m.kinds() if k == "lost"]


def test_a_member_leaving_moves_only_its_partitions(kip848_broker, unique_topic):
    boot = kip848_broker.bootstrap
    create_topic(boot, unique_topic, PARTITIONS)
    members = [Member(n, boot, unique_topic, unique_topic).start() for n in ("a", "b", "c")]
    wait_for(lambda: split(members) and all(len(m.owned()) == 2 for m in members), "two partitions each")
    before = {m.name: m.owned() for m in members}
    t = time.monotonic()
    members[2].close()
    stayed = members[:2]
    wait_for(lambda: split(stayed), "c's partitions to be taken over")
    time.sleep(1.5)  # three heartbeats: nothing more happens
    for m in stayed:
        assert [k for k, _ps in m.kinds(t)] == ["assign"], m.kinds(t)  # no revocation, one increment
        assert m.owned() >= before[m.name]
    assert members[0].owned() | members[1].owned() == set(range(PARTITIONS))
    assert {len(m.owned()) for m in stayed} == {3}
    for m in stayed:
        m.close()
    assert not [e for m in members for e in m.errors]


def test_a_member_joining_is_given_partitions_incrementally(kip848_broker, unique_topic):
    boot = kip848_broker.bootstrap
    create_topic(boot, unique_topic, PARTITIONS)
    members = [Member(n, boot, unique_topic, unique_topic).start() for n in ("a", "b")]
    wait_for(lambda: split(members) and all(len(m.owned()) == 3 for m in members), "three partitions each")
    before = {m.name: m.owned() for m in members}
    t = time.monotonic()
    members.append(Member("c", boot, unique_topic, unique_topic).start())
    wait_for(lambda: split(members) and all(len(m.owned()) == 2 for m in members), "two partitions each")
    time.sleep(1.5)
    for m in members[:2]:
        # each old member gives up one partition and keeps the other two throughout
        assert m.kinds(t) == [("revoke", frozenset(before[m.name] - m.owned()))], m.kinds(t)
        assert m.owned() < before[m.name]
    # c is given each partition once its owner released it: both in one assignment when a and b
    # revoked in one heartbeat round, one then the other when not (under load; Kafka's
    # CurrentAssignmentBuilder does the same). Never a revocation, never a partition twice.
    given = members[2].kinds()
    assert {k for k, _ps in given} == {"assign"}, given
    assert sum(len(ps) for _k, ps in given) == len(members[2].owned()) == 2, given
    assert frozenset().union(*(ps for _k, ps in given)) == members[2].owned(), given
    revoked = {p: at for m in members[:2] for at, k, ps in list(m.events) if k == "revoke" for p in ps}
    assert all(revoked[p] <= at for at, k, ps in list(members[2].events) if k == "assign" for p in ps)
    for m in members:
        m.close()
    assert not [e for m in members for e in m.errors]


def test_admin_client_reports_the_group_as_a_consumer_group(kip848_broker, unique_topic):
    from confluent_kafka import ConsumerGroupType
    boot = kip848_broker.bootstrap
    create_topic(boot, unique_topic, PARTITIONS)
    m = Member("a", boot, unique_topic, unique_topic).start()
    wait_for(lambda: len(m.owned()) == PARTITIONS, "the partitions")
    admin = AdminClient({"bootstrap.servers": boot})
    listed = admin.list_consumer_groups().result(30)
    mine = [g for g in listed.valid if g.group_id == unique_topic]
    assert [g.type for g in mine] == [ConsumerGroupType.CONSUMER]
    described = admin.describe_consumer_groups([unique_topic])[unique_topic].result(30)
    assert described.type == ConsumerGroupType.CONSUMER
    assert [len(x.assignment.topic_partitions) for x in described.members] == [PARTITIONS]
    g = describe(boot, unique_topic)
    assert (g.error_code.value, g.group_state, g.assignor_name) == (0, "Stable", "uniform")
    assert [mm.member_epoch for mm in g.members] == [g.group_epoch]
    m.close()


def test_the_group_keeps_its_epochs_across_a_broker_kill9(tmp_path, unique_topic):
    """The broker is killed -9 while three members read and commit, and restarted on the same
    data: the group comes back at its epoch with every member at its epoch and assignment, so the
    members go on reading where they were: no rebalance callback, no record read twice."""
    b = BrokerProcess(tmp_path / "data", overrides=FAST_GROUPS).start()
    try:
        boot = b.bootstrap
        create_topic(boot, unique_topic, PARTITIONS)
        produce_confluent(boot, unique_topic, values("k", 12_000))
        members = [Member(n, boot, unique_topic, unique_topic, delay_s=0.001).start() for n in ("a", "b", "c")]
        wait_for(lambda: split(members) and all(len(m.owned()) == 2 for m in members), "two partitions each")
        wait_for(lambda: describe(boot, unique_topic).group_state == "Stable", "the group to be stable")
        before = describe(boot, unique_topic)
        t = time.monotonic()
        wait_for(lambda: sum(len(m.read) for m in members) >= 3000, "some records read")
        b.kill()
        b.start()
        wait_for(lambda: sum(len(m.read) for m in members) >= 12_000, "every record", timeout_s=120)
        after = describe(boot, unique_topic)
        time.sleep(1)
        end = time.monotonic()
        for m in members:
            m.close()
    finally:
        b.stop()
    assert after.group_epoch == before.group_epoch
    assert {x.member_id: (x.member_epoch, x.assignment) for x in after.members} == \
        {x.member_id: (x.member_epoch, x.assignment) for x in before.members}
    for m in members:
        assert m.kinds(t, end) == [], (m.name, m.kinds(t, end))
    everything = Counter(v for m in members for v in m.read)
    assert [v for v, n in everything.items() if n > 1] == []
    assert set(everything) == set(values("k", 12_000))
    assert not [e for m in members for e in m.errors]


def test_classic_groups_of_kafkajs_and_kafka_python_beside_a_consumer_group(kafkajs, kip848_broker, unique_topic):
    """One topic read at once by a KIP-848 group of librdkafka members, a classic kafka-python
    group and a classic kafkajs group (which also produces the records): each group reads every
    record, and ListGroups tells the types apart."""
    from kafka import KafkaConsumer
    boot, n = kip848_broker.bootstrap, 6000
    create_topic(boot, unique_topic, 3)   # kafkajs_group.js's partition count
    members = [Member(x, boot, f"{unique_topic}-848", unique_topic).start() for x in ("a", "b")]
    got_kp: list[bytes] = []

    def kafka_python_group() -> None:
        c = KafkaConsumer(unique_topic, bootstrap_servers=boot, group_id=f"{unique_topic}-kp",
                          auto_offset_reset="earliest", enable_auto_commit=True, consumer_timeout_ms=20_000)
        for m in c:
            got_kp.append(m.value)
            if len(got_kp) >= n:
                break
        c.commit()
        c.close()

    kp = threading.Thread(target=kafka_python_group, daemon=True)
    kp.start()
    out = run_node(kafkajs, "kafkajs_group.js", boot, unique_topic, f"{unique_topic}-kjs", str(n))
    kp.join(120)
    wait_for(lambda: sum(len(m.read) for m in members) >= n, "the consumer group to read everything")
    admin = AdminClient({"bootstrap.servers": boot})  # kept: a collected client drops its requests
    types = {g.group_id: g.type for g in admin.list_consumer_groups().result(30).valid
             if g.group_id.startswith(unique_topic)}
    for m in members:
        m.close()
    from confluent_kafka import ConsumerGroupType
    assert types == {f"{unique_topic}-848": ConsumerGroupType.CONSUMER, f"{unique_topic}-kp": ConsumerGroupType.CLASSIC,
                     f"{unique_topic}-kjs": ConsumerGroupType.CLASSIC}
    expected = {f"kjs-{i}".encode() for i in range(n)}
    consumer_group = Counter(v for m in members for v in m.read)
    assert set(consumer_group) == expected and sum(consumer_group.values()) == n
    assert set(got_kp) == expected
    assert {d[3] for d in out["consume"]["deliveries"]} == {v.decode() for v in expected}
    assert out["consume"]["committed"] == out["produce"]["endOffsets"]
    # the topic was made here before kafkajs asked to create it
    unexpected = [e for e in unexpected_errors(out) if "CreateTopics" not in e]
    assert not unexpected, unexpected[:20]
    assert not [e for m in members for e in m.errors + m.commit_errors]
