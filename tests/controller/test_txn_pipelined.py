"""Transactional Produce requests pipelined on one connection to a partition leader whose
transaction coordinator is the other broker of a two-broker cluster (issue 24, finding 1).

The leader verifies a producer's first batch in the partition with the coordinator
(AddPartitionsToTxn v4 VerifyOnly, a round trip to the other broker). Kafka handles one request
per connection at a time, so the batches behind it wait; and concurrent checks of one producer
share one verification guard. Here both by raw requests (five Produce requests written back to
back on one connection) and by librdkafka sending one record per request, several in flight."""
from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from oncelog.client.aio.connection import Connection
from oncelog.protocol import entities
from oncelog.protocol import produce as produce_wire
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.records import Record, encode_batch
from oncelog.testing.cluster import LocalCluster

pytestmark = pytest.mark.processes

TOPIC = "piped"
COORDINATOR, LEADER = 1, 2


@pytest.fixture
def cluster(tmp_path):
    """`oncelog serve --brokers 2`'s layout: __transaction_state-0 (every transactional id's
    coordinator) on broker 1, TOPIC-0 on broker 2."""
    c = LocalCluster(tmp_path, 2, {"transaction.state.log.num.partitions": "1"}, proxies=False).start()
    try:
        admin = AdminClient({"bootstrap.servers": c.bootstrap, "log_level": 3})
        admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
        _call(c.brokers[1].bootstrap, ApiKey.FIND_COORDINATOR, 4, key_type=1,
              coordinator_keys=("warm-up",))  # creates __transaction_state
        c.place("__transaction_state", {0: COORDINATOR})
        c.place(TOPIC, {0: LEADER})
        yield c
    finally:
        c.stop()


def _call(bootstrap: str, api_key: int, version: int, **fields):
    async def run():
        conn = await _connect(bootstrap)
        try:
            return await _request(conn, api_key, version, **fields)
        finally:
            conn.close()
    return asyncio.run(run())


async def _connect(bootstrap: str) -> Connection:
    host, port = bootstrap.rsplit(":", 1)
    conn = Connection(host, int(port), "pipelined-test")
    await conn.connect(10)
    return conn


async def _request(conn: Connection, api_key: int, version: int, **fields):
    body = entities.encode(entities.make(entities.entity_class(api_key, version, "request"), **fields))
    return entities.decode_response(api_key, version, await conn.request(api_key, version, body))


async def _until_ok(conn: Connection, api_key: int, version: int, code_of, **fields):
    """The request, again while the coordinator answers a retriable error (the moved partition of
    __transaction_state still loading here, or markers still going out)."""
    retriable = (E.COORDINATOR_LOAD_IN_PROGRESS, E.COORDINATOR_NOT_AVAILABLE, E.NOT_COORDINATOR,
                 E.CONCURRENT_TRANSACTIONS)
    deadline = time.monotonic() + 30
    while True:
        r = await _request(conn, api_key, version, **fields)
        if code_of(r) not in retriable or time.monotonic() > deadline:
            assert code_of(r) == 0, r
            return r
        await asyncio.sleep(0.05)


def committed_values(bootstrap: str, expect: int, timeout_s: float = 30) -> tuple[list[bytes], int]:
    """What a read_committed reader gets from TOPIC-0 until `expect` values came (or the
    deadline), and the partition's high watermark."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{time.monotonic_ns()}",
                  "isolation.level": "read_committed", "enable.auto.commit": False, "log_level": 3})
    tp = TopicPartition(TOPIC, 0, 0)
    c.assign([tp])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < expect and time.monotonic() < deadline:
            got += [m.value() for m in c.consume(100, 0.2) if m.error() is None]
        return got, c.get_watermark_offsets(tp, timeout=10)[1]
    finally:
        c.close()


async def _pipelined_transaction(cluster: LocalCluster, tid: str, requests: int) -> list[int]:
    """One transaction whose batches go as `requests` Produce requests written back to back on
    one connection to the leader; returns their error codes in order, after committing."""
    coordinator = await _connect(cluster.brokers[COORDINATOR].bootstrap)
    leader = await _connect(cluster.brokers[LEADER].bootstrap)
    try:
        found = await _request(coordinator, ApiKey.FIND_COORDINATOR, 4, key_type=1, coordinator_keys=(tid,))
        assert int(found.coordinators[0].node_id) == COORDINATOR
        r = await _until_ok(coordinator, ApiKey.INIT_PRODUCER_ID, 3, lambda r: r.error_code.value,
                            transactional_id=tid, transaction_timeout=60000, producer_id=-1, producer_epoch=-1)
        pid, epoch = int(r.producer_id), int(r.producer_epoch)
        topic = entities.nested(ApiKey.ADD_PARTITIONS_TO_TXN, 3, "request", "AddPartitionsToTxnTopic")
        await _until_ok(coordinator, ApiKey.ADD_PARTITIONS_TO_TXN, 3,
                        lambda r: r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code.value,
                        v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid,
                        v3_and_below_producer_epoch=epoch, v3_and_below_topics=(topic(name=TOPIC, partitions=(0,)),))
        now = int(time.time() * 1000)
        futures = []
        for i in range(requests):
            records = bytes(encode_batch([Record(0, now, None, b"%s-%d" % (tid.encode(), i), [])], producer_id=pid,
                                         producer_epoch=epoch, base_sequence=i, transactional=True))
            body = produce_wire.encode_request(9, -1, 10000, {TOPIC: [(0, records)]}, transactional_id=tid)
            futures.append(leader.send(ApiKey.PRODUCE, 9, body))
        codes = [produce_wire.decode_response(9, await f)[0].partitions[0].error_code for f in futures]
        if codes == [0] * requests:
            await _until_ok(coordinator, ApiKey.END_TXN, 3, lambda r: r.error_code.value, transactional_id=tid,
                            producer_id=pid, producer_epoch=epoch, committed=True)
        return codes
    finally:
        coordinator.close()
        leader.close()


def test_raw_produce_requests_pipelined_to_a_leader_that_verifies_with_another_broker(cluster):
    codes = asyncio.run(_pipelined_transaction(cluster, "raw", 5))
    assert codes == [E.NONE] * 5
    got, high = committed_values(cluster.bootstrap, 5)
    assert got == [b"raw-%d" % i for i in range(5)]
    assert high == 6  # five records and the COMMIT marker: nothing appended twice


def test_librdkafka_one_record_per_request_commits_every_transaction(cluster):
    """The issue's reproduction: `batch.num.messages=1`, `linger.ms=0`, so each record is a
    Produce request and up to five are in flight on the connection to the leader."""
    p = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "one-per-request",
                  "batch.num.messages": 1, "linger.ms": 0, "transaction.timeout.ms": 60000, "log_level": 3})
    p.init_transactions(30)
    transactions, per_txn = 6, 10
    expected = []
    for t in range(transactions):
        p.begin_transaction()
        for i in range(per_txn):
            value = b"t%d-%d" % (t, i)
            p.produce(TOPIC, value, partition=0)
            expected.append(value)
        p.commit_transaction(30)  # raises KafkaException if any batch of the transaction failed
    got, high = committed_values(cluster.bootstrap, len(expected))
    assert got == expected  # every record once, in order
    assert high == len(expected) + transactions  # plus one COMMIT marker each: no duplicate appended
