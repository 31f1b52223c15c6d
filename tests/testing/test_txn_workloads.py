"""The copy loops of `oncelog verify --workload transactions` (testing/txn_workloads) against a
client that blocks: librdkafka (2.10 on) keeps a broker it dropped from its view as the cached
group coordinator, and send_offsets_to_transaction then waits for it past its own timeout
(librdkafka issues #5511, #5456). Before the loops bounded their calls, the transactions verify
under kills ended with a librdkafka loop stuck in that call for minutes and hundreds of inputs not
copied, whichever ports the cluster had."""
import random
import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from oncelog.testing.cluster import LocalCluster
from oncelog.testing.txn_workloads import (
    ABANDONED,
    POSITION_RESET,
    WEDGE_GRACE_S,
    Abortable,
    Fatal,
    Fenced,
    LibrdkafkaLoop,
    OncelogLoop,
    TxnWorkload,
)

pytestmark = pytest.mark.processes


def read_committed(bootstrap: str, topic: str, expect: int, timeout_s: float = 30) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{time.monotonic_ns()}", "log_level": 3,
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < expect and time.monotonic() < deadline:
            got += [m.value() for m in c.consume(100, 0.2) if m.error() is None]
        return got
    finally:
        c.close()


def _describe(admin, group: str, timeout_s: float = 60):
    """The group's description once its coordinator answers: a just-made __consumer_offsets
    partition answers NOT_COORDINATOR (retriable) until its coordinator has loaded it, as a CI run
    under load saw."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return admin.describe_consumer_groups([group])[group].result(30)
        except KafkaException as e:
            err = e.args[0]
            waiting = err.retriable() or err.code() in (
                KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                KafkaError.COORDINATOR_NOT_AVAILABLE)
            if not waiting or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _metadata_without(producer: Producer, broker: int) -> bool:
    """Does a Metadata answer leave `broker` out? False also when none came within 10 s: right
    after a broker is killed librdkafka may send its Metadata request to it (and a loaded machine
    may take that long), which is not the answer the test waits for."""
    try:
        return broker not in producer.list_topics(timeout=10).brokers
    except KafkaException as e:
        if e.args[0].code() != KafkaError._TIMED_OUT:
            raise
        return False


def test_a_librdkafka_call_blocked_past_its_timeout_gives_up_its_producer(tmp_path):
    overrides = {"transaction.state.log.num.partitions": "1", "offsets.topic.num.partitions": "1"}
    cluster = LocalCluster(tmp_path, 2, overrides, proxies=False).start()
    loop = None
    try:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 3})
        for f in admin.create_topics([NewTopic("in", 1, 1), NewTopic("out", 1, 1)]).values():
            f.result(30)
        w = TxnWorkload(cluster.bootstrap, "librdkafka", "in", "out", partitions=1, records=3)
        # the loop's group is coordinated by broker 2 (groups follow the leader of their
        # __consumer_offsets partition, made by the first lookup), its transaction and partitions by broker 1
        _describe(admin, w.group)
        cluster.place("__consumer_offsets", {0: 2})
        fresh = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 3})   # no cached coordinator
        coordinator = _describe(fresh, w.group).coordinator
        assert coordinator.id == 2, f"{w.group} coordinated by broker {coordinator.id}: the test needs broker 2"
        loop = LibrdkafkaLoop(w, "copy-0", [0], random.Random(0))
        loop.api_timeout_s = 5
        loop.consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": w.group, "log_level": 3,
                                  "enable.auto.commit": False})
        loop.open_producer()
        cluster.place("in", {0: 1})
        cluster.place("out", {0: 1})
        cluster.place("__transaction_state", {0: 1})

        def transaction(value: bytes, position: int) -> None:
            loop.begin()
            loop.produce(0, value, [None, None, None])
            loop.send_offsets({0: position})
            loop.commit()
        transaction(b"1", 1)   # librdkafka now has broker 2 cached as the group's coordinator

        cluster.kill_broker(2)
        deadline = time.monotonic() + 60
        while not _metadata_without(loop.producer, 2):   # until broker 1 answers without it
            assert time.monotonic() < deadline, "broker 2 still in the cluster's Metadata"
            time.sleep(0.2)

        loop.begin()
        loop.produce(0, b"2", [None, None, None])
        outcome: dict[str, BaseException | None] = {}

        def send() -> None:
            try:
                loop.send_offsets({0: 2})
                outcome["error"] = None
            except BaseException as e:  # noqa: BLE001 - looked at below
                outcome["error"] = e
        t = threading.Thread(target=send, daemon=True)
        t.start()
        t.join(loop.api_timeout_s + WEDGE_GRACE_S + 15)
        assert not t.is_alive(), "send_offsets_to_transaction still blocked: the loop would hold its partitions"
        # librdkafka as of 2.16 never returns: the call is given up and its producer abandoned (a
        # librdkafka that checks the timeout raises an abortable _TIMED_OUT, or finds broker 1)
        error = outcome["error"]
        assert error is None or isinstance(error, (Fatal, Abortable)), repr(error)
        if w.stats[ABANDONED]:
            assert isinstance(error, Fatal) and loop.producer is None, repr(error)
            # the loop's recovery: a new producer with the same transactional.id fences the
            # abandoned one (its transaction with "2" aborted) and copies on with broker 2 down
            loop.open_producer()
            transaction(b"3", 3)
            assert read_committed(cluster.bootstrap, "out", 2) == [b"1", b"3"]
    finally:
        if loop is not None and loop.consumer is not None:
            loop.consumer.close()
        cluster.stop()


def test_a_librdkafka_position_reset_the_loop_did_not_ask_for_is_counted(shared_broker, unique_topic):
    """librdkafka applies auto.offset.reset=earliest after a Fetch answered OFFSET_OUT_OF_RANGE and
    tells the application nothing but a log line: a copy loop then re-reads what its group committed
    and the checker finds nonmonotonic-poll and duplicate-copy with no assign before them (a CI run,
    seed 7, kill,move,reset: 375 inputs copied twice). The loop's consumer log counts such a reset,
    so that a report says where the position went."""
    admin = AdminClient({"bootstrap.servers": shared_broker.bootstrap, "log_level": 3})
    for f in admin.create_topics([NewTopic(unique_topic, 1, 1)]).values():
        f.result(30)
    p = Producer({"bootstrap.servers": shared_broker.bootstrap, "log_level": 3})
    for v in (b"a", b"b", b"c"):
        p.produce(unique_topic, v, partition=0)
    assert p.flush(30) == 0
    w = TxnWorkload(shared_broker.bootstrap, "librdkafka", unique_topic, "out", partitions=1, records=3)
    loop = LibrdkafkaLoop(w, "copy-0", [0], random.Random(0))
    loop.open_consumer()
    try:
        loop.consumer.unsubscribe()
        loop.consumer.assign([TopicPartition(unique_topic, 0, 1000)])   # beyond the log end
        deadline = time.monotonic() + 30
        got: list[bytes] = []
        while len(got) < 3:
            assert time.monotonic() < deadline, f"read {got} after the reset"
            got += [v for _q, _o, v in loop.poll()]
        assert got == [b"a", b"b", b"c"]   # from the start again: what auto.offset.reset=earliest does
        assert w.stats[POSITION_RESET] == 1, dict(w.stats)
        assert any("offset reset" in n for n in w.notes), w.notes
    finally:
        loop.close_consumer()


@pytest.mark.parametrize("client", ["oncelog", "librdkafka"])
def test_a_zombie_with_nothing_to_copy_still_hears_that_it_is_fenced(shared_broker, unique_topic, client):
    """A zombie whose group gave its partitions to its successor (or whose input is all copied)
    polls nothing and, before its loops probed, never touched its producer again: the CI run of
    the transactions verify under kills counted 0 zombies fenced for oncelog with no anomaly,
    and a zombie that was not fenced would have gone unseen the same way. Now it opens a
    transaction and sends offsets, which its successor's epoch must refuse."""
    admin = AdminClient({"bootstrap.servers": shared_broker.bootstrap, "log_level": 3})
    out = f"{unique_topic}-out"
    for f in admin.create_topics([NewTopic(unique_topic, 1, 1), NewTopic(out, 1, 1)]).values():
        f.result(30)
    w = TxnWorkload(shared_broker.bootstrap, client, unique_topic, out, partitions=1, records=1)
    loop_cls = OncelogLoop if client == "oncelog" else LibrdkafkaLoop
    zombie = loop_cls(w, f"zombie-{unique_topic}", [0], random.Random(0))
    successor = loop_cls(w, zombie.tid, [0], random.Random(1), generation=2)
    zombie.api_timeout_s = successor.api_timeout_s = 10
    try:
        zombie.open()
        successor.open()           # the same transactional.id: its InitProducerId fences the zombie
        zombie.superseded = True
        deadline = time.monotonic() + 60
        with pytest.raises((Fenced, Fatal) if client == "librdkafka" else Fenced):
            while True:            # the input topic is empty: nothing to copy
                assert time.monotonic() < deadline, "the zombie never heard that it was fenced"
                zombie.one()
    finally:
        zombie.close()
        successor.close()
