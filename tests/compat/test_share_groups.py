"""Share groups (KIP-932) with librdkafka's share consumer (confluent-kafka's `ShareConsumer`, in
preview in 2.16): members of one group read one partition together, each record delivered to one
member at a time, acknowledged one by one.

- three members, one partition: every record read exactly once with explicit ACCEPT (30,000
  records in the full tier, a tenth in CI);
- RELEASE of every 10th record at its first delivery: each comes back (delivery count 2), to some
  member, and is then accepted; nothing else is read twice;
- a member killed (SIGKILL) with records acquired: they come back to the others after the lock
  (the group's `share.record.lock.duration.ms`), with delivery count 2;
- the broker killed (SIGKILL) mid-run and restarted on its data: no record whose acknowledgement
  the broker confirmed is delivered again, and every record is accepted in the end.

Judged from outside: what each consumer was given (offset, delivery count) and what the broker
confirmed through the acknowledgement commit callback."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
from confluent_kafka import AcknowledgeType, ShareConsumer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from test_third_party_clients import create_topic, produce_confluent, values
from tests.tiers import size

from oncelog.protocol.api import ApiKey
from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.raw_client import RawConnection

pytestmark = pytest.mark.processes

FAST = {"group.share.heartbeat.interval.ms": "500", "group.share.session.timeout.ms": "10000"}
RECORDS = size(3000, 30000)


@pytest.fixture(scope="module")
def share_broker(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("share") / "data", overrides=FAST).start(timeout_s=90)
    yield b
    b.stop()


def group_configs(boot: str, group: str, **configs: str) -> None:
    """kafka-configs.sh --entity-type groups --alter (IncrementalAlterConfigs on the GROUP)."""
    a = AdminClient({"bootstrap.servers": boot})
    res = ConfigResource(ConfigResource.Type.GROUP, group, incremental_configs=[
        ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()])
    for f in a.incremental_alter_configs([res]).values():
        f.result(10)


def setup(boot: str, name: str, n: int, **configs: str) -> None:
    create_topic(boot, name, 1)
    group_configs(boot, name, share_auto_offset_reset="earliest", **configs)
    if n:
        produce_confluent(boot, name, values(name, n))


@dataclass
class Sharer:
    """One ShareConsumer in a thread, explicit acknowledgement; `decide(offset, delivery count)`
    says how to acknowledge each record."""
    name: str
    boot: str
    topic: str
    decide: object = None
    given: list[tuple[int, int]] = field(default_factory=list)      # (offset, delivery count)
    confirmed: set[int] = field(default_factory=set)                # acks the broker answered
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> Sharer:
        self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self.thread.start()
        return self

    def _on_commit(self, offsets, exc) -> None:
        if exc is None:
            for _tp, offs in offsets.items():
                self.confirmed |= set(offs)

    def _run(self) -> None:
        c = ShareConsumer({"bootstrap.servers": self.boot, "group.id": self.topic,
                           "share.acknowledgement.mode": "explicit", "client.id": self.name})
        c.set_acknowledgement_commit_callback(self._on_commit)
        c.subscribe([self.topic])
        try:
            while not self.stop.is_set():
                for m in c.poll(0.5):
                    if m.error():
                        self.errors.append(str(m.error()))
                        continue
                    self.given.append((m.offset(), m.delivery_count()))
                    kind = self.decide(m.offset(), m.delivery_count()) if self.decide else AcknowledgeType.ACCEPT
                    c.acknowledge(m, kind)
        except Exception as e:  # noqa: BLE001  (surfaced by the test: its errors are asserted empty)
            self.errors.append(repr(e))
        finally:
            c.close()


def run_until(sharers: list[Sharer], done, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    try:
        while not done():
            assert time.monotonic() < deadline, f"not done in {timeout_s}s: " + ", ".join(
                f"{s.name} given {len(s.given)}, errors {s.errors[:3]}" for s in sharers)
            assert all(s.thread is not None and s.thread.is_alive() for s in sharers), [s.errors for s in sharers]
            time.sleep(0.05)   # the consumers' progress is what is waited for; polled, with a deadline
    finally:
        for s in sharers:
            s.stop.set()
        for s in sharers:
            assert s.thread is not None
            s.thread.join(60)


def accepted(sharers: list[Sharer], released=frozenset()) -> Counter:
    """Deliveries that were accepted: every delivery but the released ones."""
    return Counter(o for s in sharers for o, c in s.given if (o, c) not in released)


def produce_small_batches(boot: str, topic: str, vals: list[bytes]) -> None:
    from confluent_kafka import Producer  # noqa: PLC0415
    p = Producer({"bootstrap.servers": boot, "linger.ms": 2, "batch.num.messages": 50})
    for v in vals:
        p.produce(topic, value=v)
        p.poll(0)
    assert p.flush(60) == 0


def members_of(boot: str, group: str) -> int:
    """How many members ShareGroupDescribe shows with an assignment."""
    r = RawConnection(boot).call(ApiKey.SHARE_GROUP_DESCRIBE, 1, group_ids=(group,),
                                 include_authorized_operations=False)
    return sum(1 for m in r.groups[0].members if m.assignment.topic_partitions)


def test_three_members_read_every_record_exactly_once(share_broker):
    topic = "share-exactly-once"
    setup(share_broker.bootstrap, topic, 0)
    sharers = [Sharer(f"m{i}", share_broker.bootstrap, topic).start() for i in range(3)]
    # every member in the group before the records come, so that they all take part
    deadline = time.monotonic() + 60
    while members_of(share_broker.bootstrap, topic) < 3:
        assert time.monotonic() < deadline, "the members did not join"
        time.sleep(0.05)
    # in batches of 50: a v1 ShareFetch (librdkafka's) acquires whole batches, as Kafka does, so
    # one large batch would go to one member whole
    produce_small_batches(share_broker.bootstrap, topic, values(topic, RECORDS))
    run_until(sharers, lambda: sum(len(s.given) for s in sharers) >= RECORDS, 120 + RECORDS / 100)
    given = Counter(o for s in sharers for o, _c in s.given)
    assert set(given) == set(range(RECORDS))
    assert [o for o, n in given.items() if n > 1] == [], "records read twice"
    assert all(c == 1 for s in sharers for _o, c in s.given)
    assert all(not s.errors for s in sharers), [s.errors for s in sharers]
    assert sum(1 for s in sharers if s.given) >= 2, "the members did not share the partition"


def test_released_records_come_back_to_some_member(share_broker):
    topic = "share-release"
    n = RECORDS // 3
    setup(share_broker.bootstrap, topic, n)

    def decide(offset: int, count: int):
        return AcknowledgeType.RELEASE if offset % 10 == 0 and count == 1 else AcknowledgeType.ACCEPT

    sharers = [Sharer(f"r{i}", share_broker.bootstrap, topic, decide).start() for i in range(3)]
    released = frozenset((o, 1) for o in range(0, n, 10))
    run_until(sharers, lambda: len(set(accepted(sharers, released))) >= n, 120 + n / 100)
    given = [(o, c) for s in sharers for o, c in s.given]
    assert Counter(given)[(0, 1)] == 1
    counts = accepted(sharers, released)
    assert set(counts) == set(range(n)) and max(counts.values()) == 1
    assert {(o, c) for o, c in given if o % 10 == 0} == {(o, c) for o in range(0, n, 10) for c in (1, 2)}
    assert all(c == 1 for o, c in given if o % 10)


CHILD = """
import json, sys, time
from confluent_kafka import ShareConsumer
c = ShareConsumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "share.acknowledgement.mode": "explicit"})
c.subscribe([sys.argv[2]])
while True:
    msgs = [m for m in c.poll(1.0) if not m.error()]
    if msgs:
        print(json.dumps([[m.offset(), m.delivery_count()] for m in msgs]), flush=True)
        break
while True:
    time.sleep(1)   # holds what it acquired until it is killed
"""


def test_a_killed_member_records_come_back_after_the_lock(share_broker):
    topic = "share-kill-member"
    n = 200
    lock_ms = 3000
    setup(share_broker.bootstrap, topic, n, share_record_lock_duration_ms=str(lock_ms))
    child = subprocess.Popen([sys.executable, "-c", CHILD, share_broker.bootstrap, topic], stdout=subprocess.PIPE,
                             text=True)
    try:
        line = child.stdout.readline() if child.stdout else ""
        held = {o for o, _c in json.loads(line)}
        assert held and all(c == 1 for _o, c in json.loads(line))
    finally:
        child.kill()
        child.wait(10)
    killed_at = time.monotonic()
    s = Sharer("after-kill", share_broker.bootstrap, topic).start()
    run_until([s], lambda: len({o for o, _c in s.given}) >= n, 60)
    seen = dict(s.given)
    assert set(seen) == set(range(n))
    # what the killed member held came back once its lock ran out, as a second delivery
    assert all(seen[o] == 2 for o in held), {o: seen[o] for o in held}
    assert time.monotonic() - killed_at < 30   # the lock, not the member's session, gave them back
    assert Counter(o for o, _c in s.given).most_common(1)[0][1] == 1


def test_a_broker_killed_mid_run_never_redelivers_what_it_confirmed(share_broker):
    topic = "share-kill-broker"
    n = RECORDS // 3
    setup(share_broker.bootstrap, topic, n)
    s = Sharer("survivor", share_broker.bootstrap, topic).start()
    deadline = time.monotonic() + 120
    while len(s.confirmed) < n // 2:
        assert time.monotonic() < deadline and s.thread is not None and s.thread.is_alive(), s.errors
        time.sleep(0.02)
    share_broker.kill()                      # kill -9 mid-run, then start again on the same data
    share_broker.start(timeout_s=90)
    confirmed_before = set(s.confirmed)
    given_before = len(s.given)
    run_until([s], lambda: len({o for o, _c in s.given}) >= n and len(s.confirmed) >= n, 180)
    again = [o for o, _c in s.given[given_before:] if o in confirmed_before]
    assert again == [], f"{len(again)} confirmed records delivered again after the crash"
    assert {o for o, _c in s.given} == set(range(n))


def test_read_committed_share_group_never_sees_aborted_records(share_broker):
    from confluent_kafka import Producer  # noqa: PLC0415
    topic = "share-read-committed"
    boot = share_broker.bootstrap
    create_topic(boot, topic, 1)
    group_configs(boot, topic, share_auto_offset_reset="earliest", share_isolation_level="read_committed")
    p = Producer({"bootstrap.servers": boot, "transactional.id": "share-rc", "linger.ms": 2})
    p.init_transactions(30)
    for i, commit in enumerate((True, False, True, False, True)):
        p.begin_transaction()
        for j in range(20):
            p.produce(topic, value=f"{'c' if commit else 'a'}-{i}-{j}".encode())
        p.flush(30)
        p.commit_transaction(30) if commit else p.abort_transaction(30)
    values_read: list[bytes] = []

    class Reader(Sharer):
        def _run(self) -> None:
            c = ShareConsumer({"bootstrap.servers": self.boot, "group.id": self.topic,
                               "share.acknowledgement.mode": "explicit"})
            c.subscribe([self.topic])
            try:
                while not self.stop.is_set():
                    for m in c.poll(0.5):
                        if not m.error():
                            self.given.append((m.offset(), m.delivery_count()))
                            values_read.append(m.value())
                            c.acknowledge(m, AcknowledgeType.ACCEPT)
            finally:
                c.close()

    r = Reader("rc", boot, topic).start()
    run_until([r], lambda: len(values_read) >= 60, 60)
    assert sorted(values_read) == sorted(f"c-{i}-{j}".encode() for i in (0, 2, 4) for j in range(20))


PAUSED_CHILD = """
import json, sys
from confluent_kafka import AcknowledgeType, ShareConsumer
results = []
c = ShareConsumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "share.acknowledgement.mode": "explicit"})
c.set_acknowledgement_commit_callback(lambda offsets, exc: results.append(
    [sorted(o for offs in offsets.values() for o in offs), exc is None]))
c.subscribe([sys.argv[2]])
while True:
    msgs = [m for m in c.poll(1.0) if not m.error()]
    if msgs:
        break
print(json.dumps([m.offset() for m in msgs]), flush=True)
sys.stdin.readline()            # the test pauses this process here, past the lock, then resumes it
for m in msgs:
    c.acknowledge(m, AcknowledgeType.ACCEPT)
c.commit_sync(30)
print(json.dumps(results), flush=True)
c.close()
"""


def test_a_paused_member_cannot_accept_what_its_lock_no_longer_covers(share_broker):
    """SIGSTOP a member holding records past its lock: the others get them; its late ACCEPT after
    SIGCONT is refused, so each record is accepted once."""
    topic = "share-pause-member"
    n = 100
    setup(share_broker.bootstrap, topic, n, share_record_lock_duration_ms="2000")
    child = subprocess.Popen([sys.executable, "-c", PAUSED_CHILD, share_broker.bootstrap, topic],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdin is not None and child.stdout is not None
        held = set(json.loads(child.stdout.readline()))
        child.send_signal(signal.SIGSTOP)
        s = Sharer("while-paused", share_broker.bootstrap, topic).start()
        run_until([s], lambda: len({o for o, _c in s.given}) >= n, 60)   # the held ones came back to s
        assert held <= {o for o, c in s.given if c == 2}
        child.send_signal(signal.SIGCONT)
        child.stdin.write("go\n")
        child.stdin.flush()
        results = json.loads(child.stdout.readline())
        late_accepted = {o for offsets, ok in results if ok for o in offsets}
        assert not late_accepted & held, "a paused member accepted records another member had been given"
        assert child.wait(60) == 0
    finally:
        child.kill()
        child.wait(10)


def test_offsets_reset_before_a_kill_9_are_where_a_share_consumer_starts_after_it(share_broker):
    """AlterShareGroupOffsets (oncelog's AdminClient: confluent-kafka 2.16's AdminClient has no
    share-group offsets methods, nor librdkafka 2.16) on a group whose records were all accepted,
    then the broker killed -9 and started again on its data: confluent-kafka's ShareConsumer is
    given the records from the new start offset, each as a first delivery."""
    from oncelog.client import AdminClient
    from oncelog.client.types import TopicPartition
    topic, n = "share-reset-kill", 100
    tp = TopicPartition(topic, 0)
    boot = share_broker.bootstrap
    setup(boot, topic, n)
    s = Sharer("before-reset", boot, topic).start()
    run_until([s], lambda: len(s.confirmed) >= n, 60)   # (stops and closes it: it leaves the group)
    deadline = time.monotonic() + 30
    admin = AdminClient({"bootstrap.servers": boot})
    try:
        assert admin.list_share_group_offsets(topic)[tp][::2] == (n, 0)   # (start offset, lag)
        while True:   # the member's leave reaches the coordinator after its close
            try:
                admin.alter_share_group_offsets(topic, {tp: 40})
                break
            except Exception as e:  # noqa: BLE001 - NON_EMPTY_GROUP until the member is gone
                assert "NON_EMPTY_GROUP" in str(e) and time.monotonic() < deadline, e
                time.sleep(0.05)
        assert admin.list_share_group_offsets(topic)[tp][::2] == (40, n - 40)
    finally:
        admin.close()
    share_broker.kill()
    share_broker.start(timeout_s=90)
    admin = AdminClient({"bootstrap.servers": boot})
    try:
        assert admin.list_share_group_offsets(topic)[tp][::2] == (40, n - 40)
    finally:
        admin.close()
    after = Sharer("after-kill", boot, topic).start()
    run_until([after], lambda: len(after.given) >= n - 40, 60)
    assert sorted(after.given) == [(o, 1) for o in range(40, n)]


def test_confluent_kafka_reads_back_the_group_configs_it_set(share_broker):
    """kafka-configs.sh --describe --entity-type groups, through confluent-kafka's AdminClient: the
    configs set on the group come back as GROUP_CONFIG (8), the others as the broker's defaults."""
    group = "share-described"
    group_configs(share_broker.bootstrap, group, **{"share.record.lock.duration.ms": "12000"})
    admin = AdminClient({"bootstrap.servers": share_broker.bootstrap})
    [future] = admin.describe_configs([ConfigResource(ConfigResource.Type.GROUP, group)]).values()
    got = {name: (entry.value, int(entry.source)) for name, entry in future.result(30).items()}
    assert got["share.record.lock.duration.ms"] == ("12000", 8), got
    assert got["share.auto.offset.reset"][1] == 5 and "errors.deadletterqueue.topic.name" in got, got
