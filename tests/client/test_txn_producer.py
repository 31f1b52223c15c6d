"""oncelog's transactional producer (the shell around client/txn_core.py) against a real
`oncelog serve`: commits read by confluent-kafka's read_committed consumer, aborts invisible to
read_committed readers (oncelog's and librdkafka's) and visible to read_uncommitted ones,
fencing by a second producer with the same transactional.id, offsets committed with the
transaction, and a kill -9 of the broker with a transaction open."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from oncelog.client.aio.connection import Connection
from oncelog.client.aio.producer import AIOProducer
from oncelog.client.errors import (
    ConfigError,
    ProducerFencedError,
    TransactionStateError,
    TransactionTimeoutError,
)
from oncelog.client.sync import Consumer, Producer
from oncelog.client.txn_core import TxnState
from oncelog.client.types import ConsumerGroupMetadata, TopicPartition
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode
from oncelog.testing.embedded import BrokerProcess

pytestmark = pytest.mark.processes

FAST = {"transaction.state.log.num.partitions": "3"}


@pytest.fixture
def txn_broker(tmp_path):
    b = BrokerProcess(tmp_path / "data", FAST).start()
    yield b
    b.stop()


def create_topic(bootstrap: str, name: str, partitions: int = 2) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        f.result()


def txn_producer(bootstrap: str, tid: str, **conf) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 0,
                     **conf})


def ck_values(bootstrap: str, topic: str, partitions: int, isolation: str, expect: int,
              timeout_s: float = 20) -> list[bytes]:
    """Values librdkafka reads (with `isolation`) until `expect` came or the partitions' ends
    were reached after the deadline's first half."""
    c = CKConsumer({"bootstrap.servers": bootstrap, "group.id": f"g-{time.monotonic_ns()}",
                    "isolation.level": isolation, "enable.auto.commit": False,
                    "enable.partition.eof": True})
    c.assign([CKTopicPartition(topic, p, 0) for p in range(partitions)])
    got: list[bytes] = []
    eofs: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                eofs.add(m.partition())
                if len(eofs) == partitions and len(got) >= expect:
                    break
                continue
            got.append(m.value())
    finally:
        c.close()
    return got


def oncelog_values(bootstrap: str, topic: str, partitions: int, isolation: str) -> list[bytes]:
    """Everything up to the high watermark (read_uncommitted) or the LSO (read_committed)."""
    c = Consumer({"auto.offset.reset": "earliest", "bootstrap.servers": bootstrap, "isolation.level": isolation})
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            got.extend(r.value for r in c.poll(0.3))
            ends = c.end_offsets(tps)
            if all((c.position(tp) or 0) >= ends[tp] for tp in tps):
                break
        return got
    finally:
        c.close()


def test_transactional_id_makes_the_producer_idempotent_and_refuses_idempotence_off():
    from oncelog.client.config import Idempotence, ProducerConfig
    c = ProducerConfig.from_dict({"bootstrap.servers": "x:1", "transactional.id": "t"})
    assert c.idempotence is Idempotence.REQUIRED and c.transaction_timeout_ms == 60000
    with pytest.raises(ConfigError):
        ProducerConfig.from_dict({"bootstrap.servers": "x:1", "transactional.id": "t",
                                  "enable.idempotence": "false"})
    with pytest.raises(ConfigError, match="acks=all"):
        ProducerConfig.from_dict({"bootstrap.servers": "x:1", "transactional.id": "t", "acks": "1"})


def test_commit_to_two_partitions_is_read_by_confluent_read_committed(txn_broker):
    bs, topic = txn_broker.bootstrap, "committed"
    create_topic(bs, topic)
    with txn_producer(bs, "tx-commit") as p:
        with pytest.raises(TransactionStateError):
            p.send(topic, b"too early", partition=0)
        p.init_transactions(30)
        p.begin_transaction()
        futs = [p.send(topic, f"v{i}".encode(), partition=i % 2) for i in range(10)]
        p.commit_transaction(30)
        assert all(f.done() and f.exception() is None for f in futs)
        with pytest.raises(TransactionStateError):
            p.send(topic, b"outside a transaction", partition=0)
    got = ck_values(bs, topic, 2, "read_committed", 10)
    assert sorted(got) == sorted(f"v{i}".encode() for i in range(10))


def test_a_record_sent_in_an_open_transaction_does_not_wait_for_the_producers_lock(txn_broker):
    """Per record, the transactional check is a lock-free read (the loop checks again when it
    takes the record): holding the lock, as the sender loop does while it works, must not stop
    a caller's `produce` or `send`. It used to take the lock per record, which doubled the
    caller's CPU per record and made it contend with the loop."""
    bs, topic = txn_broker.bootstrap, "unlocked"
    create_topic(bs, topic, 1)
    with txn_producer(bs, "tx-unlocked") as p:
        p.init_transactions(30)
        p.begin_transaction()
        p.send(topic, b"first").result(30)   # metadata loaded, partition added
        futs = []
        worker = threading.Thread(target=lambda: (
            futs.append(p.send(topic, b"while locked")), p.produce(topic, b"produced")))
        with p.aio.lock:
            worker.start()
            worker.join(10)
            appended = not worker.is_alive()
        worker.join()
        assert appended
        p.commit_transaction(30)
        assert futs[0].result(30).offset >= 1
    assert ck_values(bs, topic, 1, "read_committed", 3) == [b"first", b"while locked", b"produced"]


def test_aborted_records_are_seen_only_by_read_uncommitted_readers(txn_broker):
    bs, topic = txn_broker.bootstrap, "aborted"
    create_topic(bs, topic)
    with txn_producer(bs, "tx-abort") as p:
        p.init_transactions(30)
        p.begin_transaction()
        for i in range(6):
            p.produce(topic, f"gone{i}".encode(), partition=i % 2)
        p.flush(30)   # the records are in the log before the abort
        p.abort_transaction(30)
        p.begin_transaction()
        p.produce(topic, b"kept", partition=1)
        p.commit_transaction(30)
    gone = {f"gone{i}".encode() for i in range(6)}
    assert ck_values(bs, topic, 2, "read_committed", 1) == [b"kept"]
    assert oncelog_values(bs, topic, 2, "read_committed") == [b"kept"]
    assert set(ck_values(bs, topic, 2, "read_uncommitted", 7)) == gone | {b"kept"}
    assert set(oncelog_values(bs, topic, 2, "read_uncommitted")) == gone | {b"kept"}


def test_a_second_producer_with_the_same_transactional_id_fences_the_first(txn_broker):
    bs, topic = txn_broker.bootstrap, "fenced"
    create_topic(bs, topic, 1)
    first = txn_producer(bs, "tx-fence")
    second = txn_producer(bs, "tx-fence")
    try:
        first.init_transactions(30)
        first.begin_transaction()
        first.send(topic, b"zombie", partition=0).result(30)
        second.init_transactions(30)   # fences the first and aborts its transaction
        with pytest.raises(ProducerFencedError):
            first.commit_transaction(30)
        second.begin_transaction()
        second.send(topic, b"live", partition=0)
        second.commit_transaction(30)
    finally:
        first.close(5)
        second.close(5)
    assert ck_values(bs, topic, 1, "read_committed", 1) == [b"live"]


async def _offset_fetch(bootstrap: str, group: str, topic: str, require_stable: bool):
    host, port = bootstrap.rsplit(":", 1)
    conn = Connection(host, int(port), "txn-test")
    await conn.connect(10)
    try:
        t = entities.nested(ApiKey.OFFSET_FETCH, 7, "request", "OffsetFetchRequestTopic")
        body = entities.encode(entities.make(
            entities.entity_class(ApiKey.OFFSET_FETCH, 7, "request"), group_id=group,
            require_stable=require_stable, topics=(t(name=topic, partition_indexes=(0,)),)))
        r = entities.decode_response(ApiKey.OFFSET_FETCH, 7,
                                     await conn.request(ApiKey.OFFSET_FETCH, 7, body))
        p = r.topics[0].partitions[0]
        return p.error_code.value, p.committed_offset
    finally:
        conn.close()


def offset_fetch(bootstrap: str, group: str, topic: str, require_stable: bool) -> tuple[int, int]:
    """OffsetFetch v7 of partition 0: (error code, committed offset)."""
    return asyncio.run(_offset_fetch(bootstrap, group, topic, require_stable))


def wait_for_offset(bootstrap: str, group: str, topic: str, offset: int) -> None:
    deadline = time.monotonic() + 20
    while offset_fetch(bootstrap, group, topic, True) != (0, offset) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert offset_fetch(bootstrap, group, topic, True) == (0, offset)


def test_send_offsets_to_transaction_commits_offsets_only_with_the_transaction(txn_broker):
    bs, src, dst, group = txn_broker.bootstrap, "src", "dst", "copy-group"
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    consumer = Consumer({"auto.offset.reset": "earliest", "bootstrap.servers": bs, "group.id": group})
    try:
        meta = consumer.consumer_group_metadata()
        assert meta == ConsumerGroupMetadata(group)
        with txn_producer(bs, "tx-offsets") as p:
            p.init_transactions(30)
            p.begin_transaction()
            p.send(dst, b"out", partition=0)
            p.send_offsets_to_transaction({TopicPartition(src, 0): 10}, meta, 30)
            p.flush(30)
            # pending in the transaction: not visible, and unstable for require_stable readers
            assert offset_fetch(bs, group, src, False) == (0, -1)
            assert offset_fetch(bs, group, src, True)[0] == ErrorCode.UNSTABLE_OFFSET_COMMIT
            p.commit_transaction(30)
        wait_for_offset(bs, group, src, 10)
    finally:
        consumer.close()


def test_aborted_offsets_are_never_committed(txn_broker):
    bs, src, group = txn_broker.bootstrap, "src2", "abort-group"
    create_topic(bs, src, 1)
    with txn_producer(bs, "tx-offsets-abort") as p:
        p.init_transactions(30)
        p.begin_transaction()
        p.send_offsets_to_transaction({TopicPartition(src, 0): 7}, ConsumerGroupMetadata(group), 30)
        p.abort_transaction(30)
        assert offset_fetch(bs, group, src, True) == (0, -1)
        p.begin_transaction()
        p.send_offsets_to_transaction([TopicPartition(src, 0, 3)], ConsumerGroupMetadata(group), 30)
        p.commit_transaction(30)
    wait_for_offset(bs, group, src, 3)


def test_the_asyncio_producer_commits(txn_broker):
    bs, topic = txn_broker.bootstrap, "aio"
    create_topic(bs, topic, 2)

    async def main() -> None:
        async with AIOProducer({"bootstrap.servers": bs, "transactional.id": "tx-aio",
                                "linger.ms": 0}) as p:
            await p.init_transactions(30)
            p.begin_transaction()
            futs = [await p.send(topic, f"a{i}".encode(), partition=i % 2) for i in range(4)]
            await p.commit_transaction(30)
            assert all(f.done() and f.exception() is None for f in futs)
    asyncio.run(main())
    assert sorted(ck_values(bs, topic, 2, "read_committed", 4)) == [b"a0", b"a1", b"a2", b"a3"]


def test_kill_9_with_a_transaction_open_then_the_producer_reinits(tmp_path):
    """The broker dies with the transaction's records in the log and no EndTxn: after restart a
    new producer with the same transactional.id re-inits (bumping the epoch aborts the open
    transaction, as Kafka), so read_committed readers never see the records; the old producer
    is fenced."""
    b = BrokerProcess(tmp_path / "data", FAST).start()
    try:
        bs, topic = b.bootstrap, "crash"
        create_topic(bs, topic)
        old = txn_producer(bs, "tx-crash", **{"delivery.timeout.ms": 60000})
        old.init_transactions(30)
        old.begin_transaction()
        for i in range(4):
            old.send(topic, f"open{i}".encode(), partition=i % 2)
        old.flush(30)
        b.kill()
        b.start()
        bs = b.bootstrap
        with txn_producer(bs, "tx-crash") as p:
            p.init_transactions(60)
            p.begin_transaction()
            p.send(topic, b"after", partition=0)
            p.commit_transaction(60)
        with pytest.raises(ProducerFencedError):
            old.commit_transaction(60)
        old.close(5)
        assert ck_values(bs, topic, 2, "read_committed", 1) == [b"after"]
        assert len(ck_values(bs, topic, 2, "read_uncommitted", 5)) == 5
    finally:
        b.stop()


def test_a_timed_out_commit_resumes_when_called_again(txn_broker):
    """confluent-kafka's retriable timeout (librdkafka #3297): the second call waits for the
    same commit, whether it is still under way or completed meanwhile; never a second EndTxn."""
    bs, topic = txn_broker.bootstrap, "resumed"
    create_topic(bs, topic, 1)
    with txn_producer(bs, "tx-resume") as p:
        p.init_transactions(30)
        for round_ in range(2):
            p.begin_transaction()
            p.send(topic, f"r{round_}".encode(), partition=0)
            with pytest.raises(TransactionTimeoutError) as e:
                p.commit_transaction(0)
            assert e.value.retriable()
            with pytest.raises(TransactionStateError):
                p.begin_transaction()   # the commit is still the call in progress
            if round_ == 1:   # completed before the caller comes back
                deadline = time.monotonic() + 20
                while p.aio.txn.state is not TxnState.READY and time.monotonic() < deadline:
                    time.sleep(0.01)
            p.commit_transaction(30)
        with pytest.raises(TransactionStateError):
            p.commit_transaction(30)   # nothing left to commit
    assert ck_values(bs, topic, 1, "read_committed", 2) == [b"r0", b"r1"]
