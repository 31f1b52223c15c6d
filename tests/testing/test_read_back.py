"""How `oncelog verify` reads a topic back: a transaction left open stops read_committed below the
partition's end, and the read says so instead of ending there (the checker's hanging-transaction
and unseen classes depend on it)."""
import pytest

from oncelog.testing.workloads import end_offsets, read_range

pytestmark = pytest.mark.processes


def test_a_transaction_left_open_leaves_its_partition_unread(broker, unique_topic):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(unique_topic, 2, 1)])[unique_topic].result(30)
    plain = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    for p in (0, 1):
        plain.produce(unique_topic, b"before", partition=p)
    assert plain.flush(30) == 0
    txn = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": unique_topic,
                    "transaction.timeout.ms": 60000})
    txn.init_transactions(30)
    txn.begin_transaction()
    txn.produce(unique_topic, b"open", partition=0)
    assert txn.flush(30) == 0   # written, neither committed nor aborted
    assert {p: hw for p, (_lo, hw) in end_offsets(broker.bootstrap, unique_topic).items()} == {0: 2, 1: 1}
    unread: set[int] = set()
    records, _ends = read_range(broker.bootstrap, unique_topic, timeout_s=3, unread=unread)
    assert unread == {0} and records == {0: [(0, b"before")], 1: [(0, b"before")]}
    txn.abort_transaction(30)
