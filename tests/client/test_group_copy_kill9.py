"""A consume-transform-produce loop written with oncelog's client alone: a consumer in a KIP-848
group (subscribe, read_committed) and a transactional producer committing the consumer's
positions with `send_offsets_to_transaction` (the member's epoch fences a zombie, KIP-447). The
broker is killed -9 and restarted twice with a transaction open that produced records: once
before its offsets were sent, once after; and the application gives up on one transaction after
its offsets were sent. The loop recovers as an application must: abort (or a
new producer when the old one is fenced or fatal), rewind to the group's committed offsets, go
on. Judged from outside: a read_committed read of the output holds every input record exactly
once, in input order per partition; the group's committed offsets are the input's ends."""
from __future__ import annotations

import time

import pytest

from oncelog.client import AdminClient, Consumer, Producer
from oncelog.client.errors import KafkaClientError, ProducerFatalError
from oncelog.client.types import TopicPartition
from oncelog.testing.embedded import BrokerProcess

# one fault matrix at a time (tests/conftest.py)
pytestmark = [pytest.mark.processes, pytest.mark.xdist_group("faults")]

RECORDS, PARTITIONS = 3000, 3
INPUT, OUTPUT, GROUP, TID = "copy-in", "copy-out", "copy-group", "copy-txn"
SETTINGS = {"transaction.state.log.num.partitions": "3", "group.consumer.min.heartbeat.interval.ms": "100",
            "group.consumer.heartbeat.interval.ms": "500", "group.consumer.min.session.timeout.ms": "10000",
            "group.consumer.session.timeout.ms": "30000"}
KILLS = {5: "produced", 12: "offsets_sent"}
GIVE_UP_AT = 20   # the application fails this transaction after its offsets were sent: it aborts and rewinds


class Failed(KafkaClientError):
    """The application's own failure."""


def test_a_copy_loop_of_oncelog_clients_is_exactly_once_through_broker_kills(tmp_path):
    b = BrokerProcess(tmp_path / "data", SETTINGS).start()
    conf = {"bootstrap.servers": b.bootstrap}
    try:
        admin = AdminClient(conf)
        for created in admin.create_topics([INPUT, OUTPUT], num_partitions=PARTITIONS).values():
            created.result()
        admin.close()
        with Producer({**conf, "enable.idempotence": True}) as seed:
            for i in range(RECORDS):
                seed.send(INPUT, b"%d" % i, partition=i % PARTITIONS)
            seed.flush(60)
        consumer = Consumer({**conf, "group.id": GROUP, "group.protocol": "consumer", "enable.auto.commit": False,
                             "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
        consumer.subscribe([INPUT])
        producer = _producer(conf)
        tps = [TopicPartition(INPUT, p) for p in range(PARTITIONS)]
        done, step, kills, failures = 0, 0, [], 0
        deadline = time.monotonic() + 240
        while done < RECORDS:
            assert time.monotonic() < deadline, (done, kills, failures)
            records = consumer.poll(0.5, max_records=100)
            if not records:
                done = sum(tp.offset or 0 for tp in consumer.committed(tps, 60))
                continue
            try:
                producer.begin_transaction()
                for r in records:
                    producer.send(OUTPUT, b"out-" + r.value, partition=r.partition)
                producer.flush(60)
                if KILLS.get(step) == "produced" and step not in kills:
                    kills.append(step)
                    b.kill()
                    b.start()
                positions = {}
                for r in records:
                    positions[TopicPartition(r.topic, r.partition)] = r.offset + 1
                producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 60)
                if KILLS.get(step) == "offsets_sent" and step not in kills:
                    kills.append(step)
                    b.kill()
                    b.start()
                if step == GIVE_UP_AT:
                    raise Failed("the application gives up on this transaction")
                producer.commit_transaction(60)
            except KafkaClientError as e:
                failures += 1
                producer = _recover(producer, conf, e)
                for tp in consumer.committed(tps, 60):       # back to what the last commit consumed
                    if TopicPartition(tp.topic, tp.partition) in consumer.assignment():
                        consumer.seek(tp, tp.offset or 0)
            step += 1
        consumer.close()
        producer.close(30)
        print(f"{step} transactions, {failures} failed and were redone, broker killed at {kills}")
        assert sorted(kills) == sorted(KILLS), "a fault was not injected"
        assert failures >= 1
        out = _read_committed(conf)
        for p in range(PARTITIONS):
            vals = [int(v[4:]) for v in out[p]]
            print(p, len(vals), vals[:5], [(a, b) for a, b in zip(vals, vals[1:]) if b != a + 3][:10])
        for p in range(PARTITIONS):
            assert out[p] == [b"out-%d" % i for i in range(p, RECORDS, PARTITIONS)], p
    finally:
        b.stop()


def _producer(conf: dict) -> Producer:
    p = Producer({**conf, "transactional.id": TID})
    p.init_transactions(60)
    return p


def _recover(producer: Producer, conf: dict, error: Exception) -> Producer:
    """Abort what the failed transaction did; a producer that cannot go on is replaced (its
    successor's init_transactions fences it and aborts what it left open)."""
    if not isinstance(error, ProducerFatalError):
        try:
            producer.abort_transaction(60)
            return producer
        except KafkaClientError:
            pass
    producer.close(5)
    return _producer(conf)


def _read_committed(conf: dict) -> dict[int, list[bytes]]:
    c = Consumer({"auto.offset.reset": "earliest", **conf, "isolation.level": "read_committed"})
    tps = [TopicPartition(OUTPUT, p) for p in range(PARTITIONS)]
    ends = c.end_offsets(tps)
    c.assign([TopicPartition(OUTPUT, p, 0) for p in range(PARTITIONS)])
    out: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    deadline = time.monotonic() + 60
    while any((c.position(tp) or 0) < ends[tp] for tp in tps) and time.monotonic() < deadline:
        for r in c.poll(0.5):
            out[r.partition].append(r.value)
    c.close()
    return out
