"""Consumer groups of unmodified clients across a broker killed -9 and restarted, then stopped and
started cleanly, on the same data: the group comes back Stable at its generation (Kafka reloads
its GroupMetadata records; a KIP-848 group its records, at its epochs), so its members keep their
member ids and partitions and never hear UNKNOWN_MEMBER_ID or ILLEGAL_GENERATION (nor
FENCED_MEMBER_EPOCH or GROUP_ID_NOT_FOUND).

Judged from outside: each member's rebalance callbacks with timestamps (no partition owned by two
members at once, and none after the group first split its partitions), the member id and
generation each client reports of itself (unchanged after the split), the clients' own logs (no
UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION answer), and the records read: every record produced, none
twice (a member that keeps its partitions never re-reads, so no record comes back, committed or
not). Static members (group.instance.id) with librdkafka's
cooperative-sticky assignor too. A transactional copy loop (confluent-kafka,
send_offsets_to_transaction with the consumer's group metadata) commits through both restarts
without an abort.
"""
from __future__ import annotations

import logging
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from test_transactions import FAST, create_topic, wait_for_state
from test_txn_copy_kill9 import CLIENT, read_committed_output, transform

from oncelog.core.txn.log_format import partition_for
from oncelog.testing.cluster import LocalCluster
from oncelog.testing.embedded import BrokerProcess

pytestmark = pytest.mark.processes

PARTITIONS = 4
SESSION_MS = 30_000  # well beyond a restart: the clients' own session timers never run out
DEADLINE_S = 90
FENCED = ("UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION", "Unknown member", "generation id is not valid",
          "UnknownMemberId", "IllegalGeneration", "FENCED_MEMBER_EPOCH", "member epoch is fenced", "GROUP_ID_NOT_FOUND",
          "STALE_MEMBER_EPOCH")
# KIP-848 (librdkafka's group.protocol=consumer): the coordinator sets the timeouts, the client
# may not; the member epoch stands for the generation
CONSUMER_PROTOCOL = {"group.protocol": "consumer"}


@dataclass
class Run:
    """What the members saw, shared by their threads."""
    events: list[tuple[float, str, str, frozenset[int]]] = field(default_factory=list)  # (t, member, kind, ps)
    values: Counter = field(default_factory=Counter)
    identities: list[tuple[float, str, str]] = field(default_factory=list)  # (t, member, "id@generation")
    fenced_lines: list[str] = field(default_factory=list)
    commits_ok_since: dict[str, float] = field(default_factory=dict)  # member -> last successful commit
    commit_errors: Counter = field(default_factory=Counter)
    crashed: list[str] = field(default_factory=list)  # a member thread's exception
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def identity(self, member: str, identity: str) -> None:
        """What a member reports of itself, when it changes."""
        with self.lock:
            if not any(m == member for _t, m, _i in self.identities) or \
                    [i for _t, m, i in self.identities if m == member][-1] != identity:
                self.identities.append((time.monotonic(), member, identity))

    def event(self, member: str, kind: str, partitions) -> None:
        with self.lock:
            self.events.append((time.monotonic(), member, kind, frozenset(partitions)))

    def owned(self) -> dict[str, set[int]]:
        owned: dict[str, set[int]] = {}
        with self.lock:
            for _t, member, kind, ps in self.events:
                mine = owned.setdefault(member, set())
                if kind == "assign":
                    mine |= ps
                else:
                    mine -= ps
        return owned

    def split(self, members) -> bool:
        """Every partition owned, by exactly one of the members, each owning some."""
        owned = self.owned()
        parts = [owned.get(m, set()) for m in members]
        return all(parts) and sum(map(len, parts)) == PARTITIONS and set().union(*parts) == set(range(PARTITIONS))

    def overlaps(self) -> list[tuple[float, int, set[str]]]:
        """(time, partition, owners) wherever two members owned one partition at once."""
        owners: dict[int, set[str]] = {p: set() for p in range(PARTITIONS)}
        out = []
        for t, member, kind, ps in sorted(self.events):
            for p in ps:
                (owners[p].add if kind == "assign" else owners[p].discard)(member)
                if len(owners[p]) > 1:
                    out.append((t, p, set(owners[p])))
        return out

    def settled(self, members) -> bool:
        """Every member reports the same generation: a KIP-848 member that gave partitions up
        reaches the group's epoch only when its revocation is acknowledged, which can be after the
        new owner's assignment callback, so a split alone is not yet a stable group."""
        with self.lock:
            latest = {m: i for _t, m, i in self.identities}
        return set(members) <= set(latest) and len({latest[m].rsplit("@", 1)[1] for m in members}) == 1

    def committed_since(self, members, t: float) -> bool:
        with self.lock:
            return all(self.commits_ok_since.get(m, 0) > t for m in members)


class LogCatcher(logging.Handler):
    """A client's log lines that report a fenced member."""

    def __init__(self, run: Run) -> None:
        super().__init__(logging.DEBUG)
        self.run = run

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        if any(word in line for word in FENCED):
            with self.run.lock:
                self.run.fenced_lines.append(line)


def produce(bootstrap: str, topic: str, stop: threading.Event, produced: list[int]) -> None:
    """Records at a steady pace until told to stop, through the restarts (idempotent: retried
    batches are not duplicated)."""
    p = Producer({**CLIENT, "bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    n = 0
    while not stop.is_set():
        for _ in range(20):
            p.produce(topic, value=b"%d" % n, partition=n % PARTITIONS)
            n += 1
        p.poll(0.05)
    assert p.flush(60) == 0
    produced.append(n)


def confluent_member(run: Run, bootstrap: str, topic: str, name: str, **conf) -> None:
    logger = logging.getLogger(f"rdkafka.{name}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(LogCatcher(run))
    timeouts = {} if conf.get("group.protocol") == "consumer" else {"session.timeout.ms": SESSION_MS,
                                                                     "heartbeat.interval.ms": 500}
    c = Consumer({**CLIENT, "bootstrap.servers": bootstrap, "group.id": topic, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "debug": "cgrp", **timeouts, **conf}, logger=logger)
    cooperative = conf.get("partition.assignment.strategy") == "cooperative-sticky"

    def on_assign(consumer, ps):
        run.event(name, "assign", [p.partition for p in ps])
        if cooperative:
            consumer.incremental_assign(ps)

    def on_revoke(consumer, ps):
        run.event(name, "revoke", [p.partition for p in ps])
        if cooperative:
            consumer.incremental_unassign(ps)

    c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke,
                on_lost=lambda _c, ps: run.event(name, "lost", [p.partition for p in ps]))
    try:
        while not run.stop.is_set():
            msgs = [m for m in c.consume(100, 0.1) if m.error() is None]
            generation = librdkafka_generation(c)
            if c.memberid() and generation >= 0:  # -1: joining
                run.identity(name, f"{c.memberid()}@{generation}")
            if not msgs:
                continue
            with run.lock:
                run.values.update(m.value() for m in msgs)
            try:
                c.commit(asynchronous=False)
                with run.lock:
                    run.commits_ok_since[name] = time.monotonic()
            except KafkaException as e:
                run.commit_errors[e.args[0].name()] += 1
    finally:
        c.close()


def librdkafka_generation(c: Consumer) -> int:
    """The generation librdkafka puts in the group metadata it hands to send_offsets_to_transaction
    (`rd_kafka_consumer_group_metadata_write`: "CGMDv2:", then the generation as a native int32)."""
    raw = c.consumer_group_metadata()
    assert isinstance(raw, bytes) and raw.startswith(b"CGMDv2:"), raw
    return struct.unpack_from("=i", raw, 7)[0]


def kafka_python_member(run: Run, bootstrap: str, topic: str, name: str) -> None:
    from kafka import ConsumerRebalanceListener, KafkaConsumer
    from kafka.errors import KafkaError

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, ps):
            run.event(name, "revoke", [p.partition for p in ps])

        def on_partitions_assigned(self, ps):
            run.event(name, "assign", [p.partition for p in ps])

        def on_partitions_lost(self, ps):
            run.event(name, "lost", [p.partition for p in ps])

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=topic, auto_offset_reset="earliest",
                      enable_auto_commit=False, session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500,
                      client_id=name)
    c.subscribe([topic], listener=Listener())
    try:
        while not run.stop.is_set():
            batches = c.poll(timeout_ms=100)
            generation = c._coordinator._generation  # the client's view: member id and generation
            if generation is not None and generation.generation_id >= 0:  # -1: joining
                run.identity(name, f"{generation.member_id}@{generation.generation_id}")
            if not batches:
                continue
            with run.lock:
                run.values.update(r.value for rs in batches.values() for r in rs)
            try:
                c.commit()  # the positions: what poll returned
                with run.lock:
                    run.commits_ok_since[name] = time.monotonic()
            except KafkaError as e:
                run.commit_errors[type(e).__name__] += 1
    finally:
        c.close()


def wait(condition, what: str, run: Run | None = None, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert run is None or not run.crashed, run.crashed
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {run}"
        time.sleep(0.05)


def thread(run: Run, target, *args, **kwargs) -> threading.Thread:
    def body():
        try:
            target(run, *args, **kwargs)
        except BaseException as e:
            run.crashed.append(f"{target.__name__}{args}: {e!r}")
            raise
    return threading.Thread(target=body)


def restarts(b: BrokerProcess):
    """Kill -9 and restart, then stop and start cleanly."""
    def disrupt(after) -> None:
        b.kill()
        b.start()
        after("the kill -9 restart")
        b.restart(clean=True)
        after("the clean restart")
    return disrupt


def coordinator_moves(cluster: LocalCluster, group: str):
    """The group's coordinator killed -9 (the controller moves the group's `__consumer_offsets`
    partition to the other broker, which takes the group over from the shared files), then started
    again and the partition moved back to it (as Kafka's preferred leader election would)."""
    def coordinator() -> int:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 3})
        try:
            return admin.describe_consumer_groups([group])[group].result(30).coordinator.id
        except KafkaException:
            return -1  # no broker answers for it right now

    def disrupt(after) -> None:
        node = coordinator()
        assert node in cluster.brokers, node
        cluster.kill_broker(node)
        wait(lambda: coordinator() not in (node, -1), "another broker to coordinate the group")
        after(f"broker {node}, the coordinator, was killed")
        cluster.start_broker(node)
        partition = partition_for(group, 50)
        wait(lambda: cluster.move_leader("__consumer_offsets", partition, node) == 0,
             f"__consumer_offsets-{partition} moved back to broker {node}")
        wait(lambda: coordinator() == node, f"broker {node} to coordinate the group again")
        after(f"broker {node} came back")
    return disrupt


def check(run: Run, members, produced: int, split_at: float, done_at: float) -> None:
    late = [e for e in run.events if split_at < e[0] < done_at]  # closing revokes, of course
    assert not late, f"rebalance callbacks after the group first split: {late}"
    assert not run.overlaps(), run.overlaps()
    changed = [i for i in run.identities if split_at < i[0] < done_at]
    assert not changed, f"member ids or generations changed after the group split: {changed}"
    assert not run.fenced_lines, run.fenced_lines[:5]
    assert set(run.values) == {b"%d" % i for i in range(produced)}
    assert [v for v, n in run.values.items() if n > 1] == []


def group_run(bootstrap: str, topic: str, member, members, disrupt, progress: int = 200) -> None:
    """Members of `topic`'s group read what a producer writes; once the group has split the
    partitions, `disrupt(after)` does its faults and calls `after(what)` after each, which waits
    until every member committed again and `progress` more records were read."""
    run = Run()
    threads: list[threading.Thread] = []
    producer_stop, produced = threading.Event(), []

    def after(what: str) -> None:
        back, seen = time.monotonic(), sum(run.values.values())
        wait(lambda: run.committed_since(members, back) and sum(run.values.values()) >= seen + progress,
             f"commits after {what}", run)

    try:
        create_topic(bootstrap, topic, PARTITIONS)
        threads = [thread(run, member, bootstrap, topic, m) for m in members]
        threads.append(threading.Thread(target=produce, args=(bootstrap, topic, producer_stop, produced)))
        for t in threads:
            t.start()
        wait(lambda: run.split(members) and run.settled(members) and run.committed_since(members, 0),
             "the group to split its partitions", run)
        split_at = time.monotonic()
        disrupt(after)
        producer_stop.set()
        threads[-1].join(60)
        assert produced, "the producer did not finish"
        wait(lambda: len(run.values) >= produced[0], "every record to be read", run)
        done_at = time.monotonic()
        run.stop.set()
        for t in threads[:-1]:
            t.join(60)
        print(f"{produced[0]} records, events {run.events}, identities {run.identities}, "
              f"commit errors {dict(run.commit_errors)}")
        check(run, members, produced[0], split_at, done_at)
    finally:
        run.stop.set()
        producer_stop.set()
        for t in threads:
            t.join(60)


@pytest.fixture
def broker(tmp_path):
    b = BrokerProcess(tmp_path / "data").start()
    yield b
    b.stop()


def test_a_confluent_group_keeps_its_generation_across_broker_restarts(broker):
    group_run(broker.bootstrap, "rs-confluent", confluent_member, ["a", "b"], restarts(broker))


def test_static_cooperative_confluent_members_keep_their_partitions_across_broker_restarts(broker):
    """KIP-345 with cooperative-sticky: each instance keeps its member id and partitions."""
    def member(run, bootstrap, topic, name):
        confluent_member(run, bootstrap, topic, name, **{"group.instance.id": f"inst-{name}",
                                                         "partition.assignment.strategy": "cooperative-sticky"})
    group_run(broker.bootstrap, "rs-static", member, ["a", "b"], restarts(broker))


def test_a_consumer_protocol_group_keeps_its_epochs_across_broker_restarts(broker):
    """KIP-848: the members keep their member ids and epochs (the group's records reload)."""
    def member(run, bootstrap, topic, name):
        confluent_member(run, bootstrap, topic, name, **CONSUMER_PROTOCOL)
    group_run(broker.bootstrap, "rs-848", member, ["a", "b"], restarts(broker))


def test_a_kafka_python_group_keeps_its_generation_across_broker_restarts(broker):
    group_run(broker.bootstrap, "rs-kafka-python", kafka_python_member, ["a", "b"], restarts(broker))


def test_a_group_keeps_its_generation_when_its_coordinator_moves_between_brokers(tmp_path):
    """Two brokers sharing one data directory: the coordinator's broker is killed -9, the other
    one loads the group from the shared files and the members carry on at their generation; the
    group moves back when the broker returns (the other forgets it)."""
    cluster = LocalCluster(tmp_path, 2, proxies=False).start()
    try:
        group_run(cluster.bootstrap, "rs-cluster", confluent_member, ["a", "b"],
                  coordinator_moves(cluster, "rs-cluster"))

        def member(run, bootstrap, topic, name):
            confluent_member(run, bootstrap, topic, name, **CONSUMER_PROTOCOL)
        group_run(cluster.bootstrap, "rs-cluster-848", member, ["a", "b"],
                  coordinator_moves(cluster, "rs-cluster-848"))
    finally:
        cluster.stop()


# ------------------------------------------------------------------ a transactional copy loop

INPUT, OUTPUT, GROUP, TID = "rs-in", "rs-out", "rs-copier", "rs-copier-txn"
RECORDS, PER_TXN = 3000, 100


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_transactional_copy_loop_commits_through_broker_restarts_without_an_abort(tmp_path, protocol):
    """The loop's consumer is a group member (subscribe), so each TxnOffsetCommit carries its
    generation (KIP-848: its member epoch) and member id (KIP-447); the broker is killed -9 after a
    transaction's records are acknowledged and before its offsets are sent, and later restarted
    cleanly at the same point.
    Every transaction commits, none aborts, and the output holds each input record once."""
    b = BrokerProcess(tmp_path / "data", FAST).start()
    try:
        bs = b.bootstrap
        create_topic(bs, INPUT, 2)
        create_topic(bs, OUTPUT, 2)
        seed = Producer({"bootstrap.servers": bs, "enable.idempotence": True, "linger.ms": 5})
        for i in range(RECORDS):
            seed.produce(INPUT, value=b"%d" % i, partition=i % 2)
        assert seed.flush(60) == 0
        membership = CONSUMER_PROTOCOL if protocol == "consumer" else {"session.timeout.ms": SESSION_MS}
        consumer = Consumer({**CLIENT, "bootstrap.servers": bs, "group.id": GROUP, "enable.auto.commit": False,
                             "isolation.level": "read_committed", "auto.offset.reset": "earliest", **membership})
        events: list[tuple[str, frozenset[int]]] = []

        def record(kind: str):
            return lambda _c, ps: events.append((kind, frozenset(p.partition for p in ps)))
        consumer.subscribe([INPUT], on_assign=record("assign"), on_revoke=record("revoke"), on_lost=record("lost"))
        producer = Producer({**CLIENT, "bootstrap.servers": bs, "transactional.id": TID, "linger.ms": 5})
        producer.init_transactions(60)
        faults = {5: "kill", 15: "clean"}
        stats: Counter = Counter()
        n, deadline = 0, time.monotonic() + 180
        try:
            while True:
                committed = consumer.committed([TopicPartition(INPUT, p) for p in range(2)], 60)
                if sum(max(tp.offset, 0) for tp in committed) == RECORDS:
                    break
                assert time.monotonic() < deadline, dict(stats)
                producer.begin_transaction()
                messages = [m for m in consumer.consume(PER_TXN, 1.0) if not m.error()]
                for m in messages:
                    producer.produce(OUTPUT, value=transform(m.value()), partition=m.partition())
                assert producer.flush(60) == 0
                if messages and faults.get(n) and n not in stats:
                    stats[n] += 1
                    if faults[n] == "kill":
                        b.kill()
                        b.start()
                    else:
                        b.restart(clean=True)
                try:
                    producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                         consumer.consumer_group_metadata(), 60)
                    producer.commit_transaction(60)
                except KafkaException as e:
                    pytest.fail(f"transaction {n} failed after the restarts {dict(stats)}: {e.args[0]}")
                stats["committed"] += 1
                n += 1
            rebalances = list(events)  # closing revokes, of course
        finally:
            consumer.close()
        assert sorted(k for k in stats if isinstance(k, int)) == sorted(faults), "a fault was not injected"
        assert rebalances == [("assign", frozenset({0, 1}))], rebalances
        wait_for_state(bs, TID, "CompleteCommit")
        probe = Consumer({"bootstrap.servers": bs, "group.id": GROUP})
        try:
            ends = {p: probe.get_watermark_offsets(TopicPartition(OUTPUT, p), 30)[1] for p in range(2)}
        finally:
            probe.close()
        out = read_committed_output(bs, ends, OUTPUT)
        for p in range(2):
            assert out[p] == [transform(b"%d" % i) for i in range(p, RECORDS, 2)]
    finally:
        b.stop()

