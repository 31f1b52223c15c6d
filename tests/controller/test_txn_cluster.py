"""Transactions across a cluster: the coordinator (leader of `__transaction_state-0`) on broker 1,
the transaction's partitions led by other brokers, so their markers go out in WriteTxnMarkers and
their leaders verify the first batch with broker 1 (AddPartitionsToTxn v4 VerifyOnly). A
read_committed reader sees the committed records and never the aborted ones, also when a data
partition's broker is killed (-9) while its markers are outstanding (its partition then moves to
another broker, or comes back with it)."""
import os
import signal
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from oncelog.testing.cluster import LocalCluster

pytestmark = pytest.mark.processes

TOPIC = "t"


@pytest.fixture
def cluster(tmp_path):
    c = LocalCluster(tmp_path, 3, {"transaction.state.log.num.partitions": "1"}, proxies=False).start()
    yield c
    c.stop()


def txn_producer(bootstrap, tid):
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 0,
                  "transaction.timeout.ms": 60000, "log_level": 3})
    p.init_transactions(30)
    return p


def one_transaction(p, values, commit):
    p.begin_transaction()
    for i, v in enumerate(values):
        p.produce(TOPIC, v, partition=i % 2)
    p.flush(30)
    (p.commit_transaction if commit else p.abort_transaction)(30)


def read_committed(bootstrap, expect, timeout_s=30):
    """Values read_committed until `expect` values came (or the deadline)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{time.monotonic_ns()}",
                  "isolation.level": "read_committed", "enable.auto.commit": False, "log_level": 3})
    c.assign([TopicPartition(TOPIC, p, 0) for p in (0, 1)])
    got, deadline = [], time.monotonic() + timeout_s
    try:
        while len(got) < expect and time.monotonic() < deadline:
            got += [m.value() for m in c.consume(100, 0.2) if m.error() is None]
        return got
    finally:
        c.close()


def setup_cluster(cluster, data_leaders):
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 3})
    admin.create_topics([NewTopic(TOPIC, 2, 1)])[TOPIC].result(30)
    p = txn_producer(cluster.bootstrap, "warm-up")  # creates __transaction_state
    cluster.place("__transaction_state", {0: 1})
    cluster.place(TOPIC, data_leaders)
    return p


def test_commit_and_abort_with_partitions_on_two_brokers(cluster):
    setup_cluster(cluster, {0: 1, 1: 2}).flush(1)
    p = txn_producer(cluster.bootstrap, "two-brokers")
    one_transaction(p, [b"c1-%d" % i for i in range(6)], commit=True)
    one_transaction(p, [b"a1-%d" % i for i in range(6)], commit=False)
    one_transaction(p, [b"c2-%d" % i for i in range(6)], commit=True)
    got = read_committed(cluster.bootstrap, 12)
    assert sorted(got) == sorted([b"c1-%d" % i for i in range(6)] + [b"c2-%d" % i for i in range(6)])


@pytest.mark.parametrize("commit", [True, False])
def test_kill_data_broker_with_markers_outstanding(cluster, commit):
    setup_cluster(cluster, {0: 2, 1: 3}).flush(1)
    p = txn_producer(cluster.bootstrap, "killed-leader")
    p.begin_transaction()
    values = [b"x-%d" % i for i in range(10)]
    for i, v in enumerate(values):
        p.produce(TOPIC, v, partition=i % 2)
    p.flush(30)
    b3 = cluster.brokers[3]
    # Broker 3 stops answering: the coordinator's WriteTxnMarkers to it is outstanding when
    # EndTxn has been answered (PrepareCommit/PrepareAbort durable on broker 1).
    os.kill(b3.proc.pid, signal.SIGSTOP)
    try:
        (p.commit_transaction if commit else p.abort_transaction)(30)
        time.sleep(0.5)  # let the marker request reach the stopped broker's socket
    finally:
        cluster.kill_broker(3)
    cluster.start_broker(3)
    # The next transaction of the same id can only begin once every marker is acknowledged
    # (until then the coordinator answers CONCURRENT_TRANSACTIONS, which librdkafka retries).
    one_transaction(p, [b"after-%d" % i for i in range(4)], commit=True)
    expected = (values if commit else []) + [b"after-%d" % i for i in range(4)]
    got = read_committed(cluster.bootstrap, len(expected) + 1, timeout_s=15)
    assert sorted(got) == sorted(expected)


def test_v2_producers_with_the_coordinator_on_another_broker_beside_a_v1_producer(cluster):
    """Transactions V2 across brokers: oncelog's producers (V2, the cluster's default) write to
    partitions led by brokers 2 and 3 and commit offsets, while broker 1 coordinates; the
    leaders add the partitions with AddPartitionsToTxn v5 to broker 1 (several producers at once:
    their adds share requests per destination), the offsets' group coordinator does the same.
    librdkafka (V1) runs beside them. Each V2 transaction bumps the epoch; read_committed readers
    see the committed transactions of both, none of the aborted ones."""
    import threading

    from oncelog.client.sync import Producer as OncelogProducer
    from oncelog.client.types import ConsumerGroupMetadata
    from oncelog.client.types import TopicPartition as OTP

    v1 = setup_cluster(cluster, {0: 2, 1: 3})
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 3})  # alive until answered
    admin.create_topics([NewTopic("source", 1, 1)])["source"].result(30)
    errors: list[BaseException] = []
    epochs: dict[str, list[int]] = {}

    def v2_producer(n: int) -> None:
        tid = f"v2-{n}"
        try:
            with OncelogProducer({"bootstrap.servers": cluster.bootstrap, "transactional.id": tid,
                                  "linger.ms": 0}) as p:
                p.init_transactions(30)
                seen = epochs[tid] = [p.transaction_ids[1]]
                for t, commit in enumerate([True, False, True]):
                    p.begin_transaction()
                    for i in range(4):
                        p.send(TOPIC, b"%s-%d-%d-%d" % (tid.encode(), t, int(commit), i), partition=i % 2)
                    p.send_offsets_to_transaction({OTP("source", 0): t + 1}, ConsumerGroupMetadata(f"g-{n}"), 30)
                    p.flush(30)
                    (p.commit_transaction if commit else p.abort_transaction)(30)
                    seen.append(p.transaction_ids[1])
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            errors.append(e)

    threads = [threading.Thread(target=v2_producer, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    one_transaction(v1, [b"v1-c-%d" % i for i in range(4)], commit=True)
    one_transaction(v1, [b"v1-a-%d" % i for i in range(4)], commit=False)
    for t in threads:
        t.join(120)
    assert not errors, errors
    for tid, seen in epochs.items():
        assert seen == [seen[0] + k for k in range(4)], (tid, seen)   # one bump per EndTxn
    expected = [b"v1-c-%d" % i for i in range(4)] + [
        b"v2-%d-%d-1-%d" % (n, t, i) for n in range(3) for t in (0, 2) for i in range(4)]
    got = read_committed(cluster.bootstrap, len(expected) + 1, timeout_s=20)
    assert sorted(got) == sorted(expected)
