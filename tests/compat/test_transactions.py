"""The coordinator side of transactions against a real `oncelog serve`, driven by real clients
(confluent-kafka/librdkafka, kafka-python 3.x, aiokafka, kafkajs; tests/compat/txn_clients.py):
each client commits and aborts, reads back with its own read_committed consumer and is fenced by
a second producer with its transactional id; offsets in a transaction, a kill -9 between
PrepareCommit and the markers, the timeout sweeper.

What the coordinator promises is checked from outside: DescribeTransactions/ListTransactions
answers, COMMIT/ABORT control batches at the right partitions (a raw Fetch, control batches
included), committed group offsets, read_committed visibility, and KIP-890 part 1: the
coordinator verifies that a transactional batch's partition was added to its transaction.
"""
from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from test_kafkajs import kafkajs  # noqa: F401 (fixture: kafkajs installed with npm into a cache)
from txn_clients import CLIENTS, PYTHON_CLIENTS, KafkaJS

from oncelog.client.aio.connection import Connection
from oncelog.protocol import entities
from oncelog.protocol import produce as produce_wire
from oncelog.protocol.api import ApiKey
from oncelog.protocol.records import Record, encode_batch
from oncelog.protocol.records.decode import iter_record_batches
from oncelog.testing.embedded import BrokerProcess

pytestmark = pytest.mark.processes

FAST = {"transaction.state.log.num.partitions": "3"}


# ------------------------------------------------------------------ helpers
async def _call(bootstrap: str, api_key: int, version: int, **fields):
    host, port = bootstrap.rsplit(":", 1)
    conn = Connection(host, int(port), "txn-test")
    await conn.connect(10)
    try:
        body = entities.encode(entities.make(entities.entity_class(api_key, version, "request"), **fields))
        return entities.decode_response(api_key, version, await conn.request(api_key, version, body))
    finally:
        conn.close()


def call(bootstrap: str, api_key: int, version: int, **fields):
    return asyncio.run(_call(bootstrap, api_key, version, **fields))


def describe(bootstrap: str, tid: str):
    r = call(bootstrap, ApiKey.DESCRIBE_TRANSACTIONS, 0, transactional_ids=(tid,))
    return r.transaction_states[0]


def wait_for_state(bootstrap: str, tid: str, state: str, timeout_s: float = 30):
    deadline = time.monotonic() + timeout_s
    while True:
        d = describe(bootstrap, tid)
        if d.transaction_state == state or time.monotonic() > deadline:
            assert d.transaction_state == state, d
            return d
        time.sleep(0.05)


def batches(bootstrap: str, topic: str, partition: int) -> list[tuple]:
    """(kind, producer id, epoch, values) per batch: kind "COMMIT"/"ABORT" for control batches,
    "data" otherwise (read_uncommitted, control batches included)."""
    fp = entities.nested(ApiKey.FETCH, 11, "request", "FetchPartition")
    ft = entities.nested(ApiKey.FETCH, 11, "request", "FetchTopic")
    r = call(bootstrap, ApiKey.FETCH, 11, max_wait=0, min_bytes=0, max_bytes=1 << 24, isolation_level=0,
             topics=(ft(topic=topic, partitions=(fp(partition=partition, fetch_offset=0,
                                                   partition_max_bytes=1 << 24),)),),
             forgotten_topics_data=())
    p = r.responses[0].partitions[0]
    assert p.error_code.value == 0, p
    out = []
    for header, records in iter_record_batches(bytes(p.records or b"")):
        if header.is_control:
            kind = "COMMIT" if records[0].key[2:4] == b"\x00\x01" else "ABORT"
            out.append((kind, header.producer_id, header.producer_epoch, ()))
        else:
            out.append(("data", header.producer_id, header.producer_epoch,
                        tuple(bytes(rec.value) for rec in records)))
    return out


def markers(bootstrap: str, topic: str, partition: int) -> list[str]:
    return [b[0] for b in batches(bootstrap, topic, partition) if b[0] != "data"]


def wait_for_markers(bootstrap: str, topic: str, partition: int, expected: list[str], timeout_s: float = 30):
    deadline = time.monotonic() + timeout_s
    while markers(bootstrap, topic, partition) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert markers(bootstrap, topic, partition) == expected


def offset_fetch(bootstrap: str, group: str, topic: str, require_stable: bool) -> int:
    """OffsetFetch v7 for partition 0: its error code."""
    t = entities.nested(ApiKey.OFFSET_FETCH, 7, "request", "OffsetFetchRequestTopic")
    r = call(bootstrap, ApiKey.OFFSET_FETCH, 7, group_id=group, require_stable=require_stable,
             topics=(t(name=topic, partition_indexes=(0,)),))
    return r.topics[0].partitions[0].error_code.value


def create_topic(bootstrap: str, name: str, partitions: int = 2) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the futures resolve
    for f in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        f.result()


def txn_producer(bootstrap: str, tid: str, **conf) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 0, **conf})


@pytest.fixture
def txn_broker(tmp_path):
    b = BrokerProcess(tmp_path / "data", FAST).start()
    yield b
    b.stop()


# ------------------------------------------------------------------ librdkafka
def test_confluent_commit_then_abort_writes_markers_on_every_partition(txn_broker):
    bs, topic, tid = txn_broker.bootstrap, "orders", "tx-commit-abort"
    create_topic(bs, topic)
    p = txn_producer(bs, tid)
    p.init_transactions(30)
    d = describe(bs, tid)
    assert (d.error_code.value, d.transaction_state, int(d.producer_epoch)) == (0, "Empty", 0)
    p.begin_transaction()
    for i in range(4):
        p.produce(topic, value=b"c%d" % i, partition=i % 2)
    p.commit_transaction(30)
    d = wait_for_state(bs, tid, "CompleteCommit")
    assert not d.topics  # Complete* keeps no partitions
    p.begin_transaction()
    p.produce(topic, value=b"a0", partition=0)
    p.flush(30)  # else abort_transaction purges it unsent and, nothing added, sends no EndTxn
    p.abort_transaction(30)
    wait_for_state(bs, tid, "CompleteAbort")
    pid = int(d.producer_id)
    assert {(kind, b_pid, epoch) for kind, b_pid, epoch, _v in batches(bs, topic, 0) + batches(bs, topic, 1)} \
        <= {("data", pid, 0), ("COMMIT", pid, 0), ("ABORT", pid, 0)}
    assert markers(bs, topic, 0) == ["COMMIT", "ABORT"]
    assert markers(bs, topic, 1) == ["COMMIT"]  # not in the aborted transaction
    data0 = [v for kind, _p, _e, vals in batches(bs, topic, 0) if kind == "data" for v in vals]
    assert data0 == [b"c0", b"c2", b"a0"]
    listed = call(bs, ApiKey.LIST_TRANSACTIONS, 1, state_filters=("CompleteAbort", "NoSuchState"),
                  producer_id_filters=(), duration_filter=-1)
    assert [(s.transactional_id, s.transaction_state) for s in listed.transaction_states] == [(tid, "CompleteAbort")]
    assert list(listed.unknown_state_filters) == ["NoSuchState"]
    p.flush()


def test_send_offsets_to_transaction_commits_the_group_offsets_with_the_transaction(txn_broker):
    bs, src, dst, group = txn_broker.bootstrap, "src", "dst", "copier"
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    plain = Producer({"bootstrap.servers": bs})
    for i in range(10):
        plain.produce(src, value=b"%d" % i, partition=0)
    plain.flush(30)
    consumer = Consumer({"bootstrap.servers": bs, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "isolation.level": "read_uncommitted"})
    consumer.subscribe([src])
    seen = []
    deadline = time.monotonic() + 30
    while len(seen) < 10 and time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is not None and not m.error():
            seen.append(m)
    assert len(seen) == 10
    p = txn_producer(bs, "tx-copy")
    p.init_transactions(30)
    # an aborted transaction's offsets are dropped
    p.begin_transaction()
    p.produce(dst, value=b"x")
    p.flush(30)
    p.send_offsets_to_transaction([TopicPartition(src, 0, 5)], consumer.consumer_group_metadata(), 30)
    p.abort_transaction(30)
    assert consumer.committed([TopicPartition(src, 0)], 10)[0].offset < 0
    # a committed one's are made visible by the marker on the group's offsets partition
    p.begin_transaction()
    for m in seen:
        p.produce(dst, value=m.value())
    p.send_offsets_to_transaction(consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30)
    d = describe(bs, "tx-copy")
    assert "__consumer_offsets" in {str(t.topic) for t in d.topics}
    assert offset_fetch(bs, group, src, require_stable=True) == 88   # UNSTABLE_OFFSET_COMMIT (KIP-447)
    assert offset_fetch(bs, group, src, require_stable=False) == 0   # the last committed (none)
    p.commit_transaction(30)
    wait_for_state(bs, "tx-copy", "CompleteCommit")
    deadline = time.monotonic() + 30
    while consumer.committed([TopicPartition(src, 0)], 10)[0].offset != 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert consumer.committed([TopicPartition(src, 0)], 10)[0].offset == 10
    assert markers(bs, dst, 0) == ["ABORT", "COMMIT"]
    consumer.close()


def test_kill_9_between_prepare_commit_and_the_markers_completes_after_restart(tmp_path):
    topic, tid = "crashy", "tx-crash"
    # SIGKILL right after the first write to crashy-0 that follows the transaction's one batch:
    # the COMMIT marker, written only once PrepareCommit was fsynced.
    b = BrokerProcess(tmp_path / "data", FAST, env={"ONCELOG_FAILPOINTS": f"crash:log:match={topic}-0:after=1"})
    b.start()
    try:
        bs = b.bootstrap
        create_topic(bs, topic)
        p = txn_producer(bs, tid, **{"message.timeout.ms": 5000})
        p.init_transactions(30)
        p.begin_transaction()
        p.produce(topic, value=b"kept-0", partition=0)
        p.produce(topic, value=b"kept-1", partition=1)
        p.flush(30)
        try:
            p.commit_transaction(5)
        except KafkaException:
            pass  # the answer may or may not have left before the kill
        b.proc.wait(30)
        assert not b.running, "the failpoint did not fire"
        b.env = {}
        b.start()
        bs = b.bootstrap
        d = wait_for_state(bs, tid, "CompleteCommit")
        assert int(d.producer_epoch) == 0
        assert "COMMIT" in markers(bs, topic, 0)
        assert markers(bs, topic, 1)[-1:] == ["COMMIT"]
        assert "transactions to complete" in b.log_tail(20000)
    finally:
        b.stop()


def test_the_sweeper_aborts_a_transaction_left_open_past_its_timeout(tmp_path):
    b = BrokerProcess(tmp_path / "data", {**FAST, "transaction.abort.timed.out.transaction.cleanup.interval.ms": "100"})
    b.start()
    try:
        bs, topic, tid = b.bootstrap, "slow", "tx-slow"
        create_topic(bs, topic, 1)
        p = txn_producer(bs, tid, **{"transaction.timeout.ms": 1000})
        p.init_transactions(30)
        p.begin_transaction()
        p.produce(topic, value=b"never", partition=0)
        p.flush(30)
        d = wait_for_state(bs, tid, "CompleteAbort")
        assert int(d.producer_epoch) == 1  # fenced: the zombie's epoch is refused from now on
        wait_for_markers(bs, topic, 0, ["ABORT"])
        with pytest.raises(KafkaException):
            p.commit_transaction(10)
    finally:
        b.stop()


async def _produce(bootstrap: str, version: int, topic: str, records: bytes, tid: str) -> int:
    host, port = bootstrap.rsplit(":", 1)
    conn = Connection(host, int(port), "txn-test")
    await conn.connect(10)
    try:
        body = produce_wire.encode_request(version, -1, 10000, {topic: [(0, records)]}, transactional_id=tid)
        return produce_wire.decode_response(version, await conn.request(ApiKey.PRODUCE, version, body))[0] \
            .partitions[0].error_code
    finally:
        conn.close()


def test_a_transactional_batch_is_appended_only_to_a_partition_added_to_its_transaction(txn_broker):
    """KIP-890 part 1 with the real coordinator: the partition leader asks the coordinator (here
    the same broker) whether the batch's partition is in the producer's transaction."""
    bs = txn_broker.bootstrap
    create_topic(bs, "verified", 1)
    deadline = time.monotonic() + 30
    while True:  # the first one creates __transaction_state: COORDINATOR_LOAD_IN_PROGRESS meanwhile
        r = call(bs, ApiKey.INIT_PRODUCER_ID, 3, transactional_id="tv", transaction_timeout=60000,
                 producer_id=-1, producer_epoch=-1)
        if r.error_code.value != 14 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert r.error_code.value == 0
    pid, epoch = int(r.producer_id), int(r.producer_epoch)
    records = bytes(encode_batch([Record(0, int(time.time() * 1000), None, b"t", [])], producer_id=pid,
                                 producer_epoch=epoch, base_sequence=0, transactional=True))
    assert asyncio.run(_produce(bs, 9, "verified", records, "tv")) == 48  # INVALID_TXN_STATE
    topic = entities.nested(ApiKey.ADD_PARTITIONS_TO_TXN, 3, "request", "AddPartitionsToTxnTopic")
    r = call(bs, ApiKey.ADD_PARTITIONS_TO_TXN, 3, v3_and_below_transactional_id="tv", v3_and_below_producer_id=pid,
             v3_and_below_producer_epoch=epoch, v3_and_below_topics=(topic(name="verified", partitions=(0,)),))
    assert r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code.value == 0
    assert asyncio.run(_produce(bs, 9, "verified", records, "tv")) == 0
    assert batches(bs, "verified", 0) == [("data", pid, epoch, (b"t",))]  # the refused one left nothing


def test_unknown_ids_and_bad_timeouts_get_kafkas_codes(txn_broker):
    bs = txn_broker.bootstrap
    r = call(bs, ApiKey.FIND_COORDINATOR, 4, key_type=1, coordinator_keys=("a", "b"))  # creates the topic
    assert [(c.key, c.error_code.value, c.port) for c in r.coordinators] == [("a", 0, txn_broker.port),
                                                                            ("b", 0, txn_broker.port)]
    d = describe(bs, "never-seen")
    assert d.error_code.value == 105  # TRANSACTIONAL_ID_NOT_FOUND
    r = call(bs, ApiKey.INIT_PRODUCER_ID, 4, transactional_id="tx-timeout", transaction_timeout=10**9,
             producer_id=-1, producer_epoch=-1)
    assert r.error_code.value == 50  # INVALID_TRANSACTION_TIMEOUT
    r = call(bs, ApiKey.END_TXN, 3, transactional_id="never-seen", producer_id=5, producer_epoch=0, committed=True)
    assert r.error_code.value == 49  # INVALID_PRODUCER_ID_MAPPING
    r = call(bs, ApiKey.END_TXN, 1, transactional_id="never-seen", producer_id=5, producer_epoch=0, committed=True)
    assert r.error_code.value == 49


# ------------------------------------------------------------------ every client
@pytest.fixture(params=CLIENTS)
def txn_client(request):
    """Each client library's transactional producer and read_committed consumer (txn_clients.py)."""
    if request.param == KafkaJS.name:
        return KafkaJS(request.getfixturevalue("kafkajs"))
    return PYTHON_CLIENTS[request.param]()


def data_values(bootstrap: str, topic: str, partition: int) -> list[bytes]:
    return [v for kind, _p, _e, vals in batches(bootstrap, topic, partition) if kind == "data" for v in vals]


def test_each_client_commits_one_aborts_one_and_reads_back_exactly_the_committed(txn_broker, txn_client):
    """The aborted transaction comes first, so a reader that got every committed record has read
    past every aborted one: what it returned is exactly what it was given."""
    bs, topic, tid = txn_broker.bootstrap, "both", f"tx-both-{txn_client.name}"
    create_topic(bs, topic)
    aborted = [(0, b"a0"), (1, b"a1"), (0, b"a2")]
    committed = [(0, b"c0"), (1, b"c1"), (0, b"c2"), (1, b"c3")]
    txn_client.commit_abort(bs, topic, tid, aborted, committed)
    wait_for_state(bs, tid, "CompleteCommit")
    for part in (0, 1):
        wait_for_markers(bs, topic, part, ["ABORT", "COMMIT"])
        # the aborted records are in the log: the read below has to filter them
        assert data_values(bs, topic, part) == [v for p, v in aborted + committed if p == part]
    got = txn_client.read_committed(bs, topic, 2, len(committed))
    for part in (0, 1):
        assert [v for p, v in got if p == part] == [v for p, v in committed if p == part], got
    assert len(got) == len(committed)


def test_each_client_is_fenced_by_a_second_producer_with_the_same_id(txn_broker, txn_client):
    bs, topic, tid = txn_broker.bootstrap, "fenced", f"tx-fence-{txn_client.name}"
    create_topic(bs, topic, 1)
    err = txn_client.fence(bs, topic, tid)
    assert txn_client.is_fenced(err), f"the first producer's commit after the fence gave {err!r}"
    d = wait_for_state(bs, tid, "CompleteCommit")
    assert int(d.producer_epoch) == 2  # one bump to fence, one for the new session
    wait_for_markers(bs, topic, 0, ["ABORT", "COMMIT"])
    assert data_values(bs, topic, 0) == [b"zombie", b"new"]
    assert txn_client.read_committed(bs, topic, 1, 1) == [(0, b"new")]


# ------------------------------------------------------------------ kafkajs
def test_kafkajs_send_offsets_commits_the_group_offsets_with_the_transaction(txn_broker, kafkajs):
    bs, topic, tid, group = txn_broker.bootstrap, "kjs", "tx-kafkajs", "kjs-group"
    create_topic(bs, topic)
    KafkaJS(kafkajs).send_offsets(bs, topic, tid, group, 3)
    wait_for_state(bs, tid, "CompleteCommit")
    assert markers(bs, topic, 1) == ["COMMIT"]
    c = Consumer({"bootstrap.servers": bs, "group.id": group})
    try:
        assert c.committed([TopicPartition(topic, 0)], 10)[0].offset == 3
    finally:
        c.close()


def test_transaction_state_is_compacted_and_a_restart_loads_each_ids_latest_state(tmp_path):
    """`__transaction_state` is a compacted topic, as in Kafka: after many transactions of one id
    the cleaner keeps its latest record, and a kill -9 and restart load exactly that state (the
    next InitProducerId bumps the same producer id's epoch, which a lost state would not)."""
    config = {"transaction.state.log.num.partitions": "1", "transaction.state.log.segment.bytes": "2048"}
    b = BrokerProcess(tmp_path / "data", config).start()
    try:
        bs, topic, tid = b.bootstrap, "compacted-state", "tx-many"
        create_topic(bs, topic, 1)
        p = txn_producer(bs, tid)
        p.init_transactions(30)
        for i in range(40):
            p.begin_transaction()
            p.produce(topic, value=b"%d" % i, partition=0)
            p.commit_transaction(30)
        # commit_transaction returns once PrepareCommit is durable; the markers follow
        before = wait_for_state(bs, tid, "CompleteCommit")
        state_dir = tmp_path / "data" / "__transaction_state-0"

        def log_bytes() -> tuple[int, int]:
            logs = list(state_dir.glob("*.log"))
            return len(logs), sum(f.stat().st_size for f in logs)

        deadline = time.monotonic() + 60
        while log_bytes()[1] > 2 * 2048 and time.monotonic() < deadline:
            time.sleep(0.1)
        segments, size = log_bytes()
        # 40 transactions wrote 100+ records of ~100 bytes: many rolled 2 KB segments, cleaned
        # down to the id's latest record (in the active segment) and little else
        assert segments >= 5 and size <= 2 * 2048, (segments, size)
        b.kill()
        b.start()
        bs = b.bootstrap
        after = wait_for_state(bs, tid, "CompleteCommit")
        assert (int(after.producer_id), int(after.producer_epoch)) == (int(before.producer_id),
                                                                        int(before.producer_epoch))
        p2 = txn_producer(bs, tid)
        p2.init_transactions(30)
        bumped = describe(bs, tid)
        assert int(bumped.producer_id) == int(before.producer_id)
        assert int(bumped.producer_epoch) == int(before.producer_epoch) + 1
    finally:
        b.stop()
