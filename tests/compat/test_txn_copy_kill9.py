"""A consume-transform-produce loop with `send_offsets_to_transaction` (confluent-kafka/librdkafka)
copies 10,000 records from an input topic to an output topic exactly once while the broker is
killed -9 and restarted on the same data directory, each time with a transaction open that has
produced records: once with half of them acknowledged and half in flight, once after all were
acknowledged, once after the offsets were added to the transaction, and once (half acknowledged)
kept down until the producer gave up on the in-flight batches, whose outcome is then unknown.

The loop recovers as librdkafka asks: a retriable commit is retried, an abortable error is
aborted and the input rewound to the group's committed offsets, a fatal one gets a new producer
(whose init_transactions fences the old one and aborts what it left open). Judged from outside:
a read_committed read of the output holds every input record exactly once, in input order per
partition, and the group's committed offsets are the input's end offsets.
"""
from __future__ import annotations

import time
from collections import Counter

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from test_transactions import FAST, create_topic, wait_for_state

from oncelog.testing.embedded import BrokerProcess

# one fault matrix at a time (tests/conftest.py)
pytestmark = [pytest.mark.processes, pytest.mark.xdist_group("faults")]

RECORDS = 10_000
PARTITIONS = 3
PER_TXN = 250
INPUT, OUTPUT, GROUP, TID = "ctp-in", "ctp-out", "ctp-group", "ctp-copier"
# (from which transaction on, where in it) the broker is killed, once each, in a transaction that
# has produced records
# has produced records; "expired": killed where "produced" is and kept down until the producer gave
# up on a batch (message.timeout.ms): librdkafka makes that abortable (epoch bump) or, when its
# EndTxn(abort) meets a transaction the coordinator never saw begin, fatal (INVALID_TXN_STATE, as
# Kafka answers it)
KILLS = [(8, "produced"), (16, "flushed"), (24, "offsets_sent"), (32, "expired")]
MESSAGE_TIMEOUT_MS = 10_000
DEADLINE_S = 300
# librdkafka 2.16 with one broker that went away and came back "forgets" it under its default
# re-bootstrap strategy and stays disconnected (docs/shared reference: clients.md §C)
CLIENT = {"metadata.recovery.strategy": "none"}


def transform(value: bytes) -> bytes:
    return b"out-" + value


class Copier:
    """The application: one consumer, one transactional producer, one transaction per step."""

    def __init__(self, bootstrap: str, fault) -> None:
        self.bootstrap, self.fault = bootstrap, fault
        self.consumer = Consumer({**CLIENT, "bootstrap.servers": bootstrap, "group.id": GROUP,
                                  "enable.auto.commit": False, "isolation.level": "read_committed",
                                  "auto.offset.reset": "earliest"})
        self.producer = self._new_producer()
        self.stats = Counter()
        self.delivery_errors = 0
        self.rewind()

    def _new_producer(self) -> Producer:
        p = Producer({**CLIENT, "bootstrap.servers": self.bootstrap, "transactional.id": TID, "linger.ms": 5,
                      "message.timeout.ms": MESSAGE_TIMEOUT_MS})
        p.init_transactions(60)
        return p

    def rewind(self) -> None:
        """Back to the group's committed offsets: what the last committed transaction consumed."""
        committed = self.consumer.committed([TopicPartition(INPUT, p) for p in range(PARTITIONS)], 60)
        self.consumer.assign([TopicPartition(INPUT, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
                              for tp in committed])

    def done(self) -> bool:
        committed = self.consumer.committed([TopicPartition(INPUT, p) for p in range(PARTITIONS)], 60)
        return sum(max(tp.offset, 0) for tp in committed) == RECORDS

    def transaction(self, n: int) -> None:
        p = self.producer
        p.begin_transaction()
        messages = [m for m in self.consumer.consume(PER_TXN, 1.0) if not m.error()]
        # in two halves, the first acknowledged before the second is produced: a kill then
        # interrupts a transaction that has records in the log and records in flight
        half = len(messages) // 2
        for i, m in enumerate(messages):
            if i == half:
                p.flush(60)
            p.produce(OUTPUT, value=transform(m.value()), partition=m.partition(), on_delivery=self._delivered)
        self.fault(n, "produced", len(messages))
        self.fault(n, "expired", len(messages))
        p.flush(60)
        self.fault(n, "flushed", len(messages))
        p.send_offsets_to_transaction(self.consumer.position(self.consumer.assignment()),
                                      self.consumer.consumer_group_metadata(), 60)
        self.fault(n, "offsets_sent", len(messages))
        self._commit()
        self.stats["committed"] += 1

    def _delivered(self, err, _msg) -> None:
        if err is not None:
            self.delivery_errors += 1

    def _commit(self) -> None:
        while True:
            try:
                self.producer.commit_transaction(60)
                return
            except KafkaException as e:
                if not e.args[0].retriable():
                    raise
                self.stats["commit retried"] += 1

    def step(self, n: int) -> None:
        try:
            self.transaction(n)
        except KafkaException as e:
            err = e.args[0]
            self.stats[f"error {err.name()}"] += 1
            if err.txn_requires_abort():
                self.stats["aborted"] += 1
                try:
                    self.producer.abort_transaction(60)
                except KafkaException as abort_error:
                    self.stats[f"abort failed {abort_error.args[0].name()}"] += 1
                    self._replace_producer()
            else:
                self._replace_producer()
            self.rewind()

    def _replace_producer(self) -> None:
        self.stats["new producer"] += 1
        self.producer = self._new_producer()

    def close(self) -> None:
        self.consumer.close()


def read_committed_output(bootstrap: str, ends: dict[int, int], topic: str = OUTPUT) -> dict[int, list[bytes]]:
    """Every partition of `topic` in `ends` read with read_committed up to its end offset."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "ctp-reader", "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
    out: dict[int, list[bytes]] = {p: [] for p in ends}
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            positions = c.position([TopicPartition(topic, p) for p in ends])
            if all(tp.offset >= ends[tp.partition] for tp in positions):
                break
            for m in c.consume(1000, 0.2):
                if not m.error():
                    out[m.partition()].append(m.value())
    finally:
        c.close()
    return out


def test_a_copy_loop_moves_10000_records_exactly_once_through_kill_9s_with_transactions_open(tmp_path):
    b = BrokerProcess(tmp_path / "data", FAST).start()
    try:
        bs = b.bootstrap
        create_topic(bs, INPUT, PARTITIONS)
        create_topic(bs, OUTPUT, PARTITIONS)
        seed = Producer({"bootstrap.servers": bs, "enable.idempotence": True, "linger.ms": 5})
        for i in range(RECORDS):
            seed.produce(INPUT, value=b"%d" % i, partition=i % PARTITIONS)
        assert seed.flush(60) == 0

        kills, pending = [], list(KILLS)

        def fault(n: int, where: str, produced: int) -> None:
            if pending and n >= pending[0][0] and where == pending[0][1] and produced:
                pending.pop(0)
                b.kill()
                if where == "expired":
                    deadline = time.monotonic() + MESSAGE_TIMEOUT_MS / 1000 + 60
                    while not copier.delivery_errors:
                        assert time.monotonic() < deadline, "no batch expired while the broker was down"
                        copier.producer.poll(0.1)
                b.start()
                kills.append((n, where))

        copier = Copier(bs, fault)
        try:
            n, deadline = 0, time.monotonic() + DEADLINE_S
            while not copier.done():
                assert time.monotonic() < deadline, f"not done after {DEADLINE_S}s: {copier.stats}"
                copier.step(n)
                n += 1
        finally:
            copier.close()
        assert [w for _n, w in kills] == [w for _n, w in KILLS]
        assert copier.stats["aborted"] + copier.stats["new producer"] >= 1, "the expired batch was not recovered"
        print(f"{n} transactions, kills at {kills}: {dict(copier.stats)}")

        # the last transaction's markers written: the output's LSO reached its end
        wait_for_state(bs, TID, "CompleteCommit")
        probe = Consumer({"bootstrap.servers": bs, "group.id": GROUP, "isolation.level": "read_uncommitted"})
        try:
            ends = {p: probe.get_watermark_offsets(TopicPartition(OUTPUT, p), 30)[1] for p in range(PARTITIONS)}
            in_ends = {p: probe.get_watermark_offsets(TopicPartition(INPUT, p), 30)[1] for p in range(PARTITIONS)}
            committed = probe.committed([TopicPartition(INPUT, p) for p in range(PARTITIONS)], 30)
        finally:
            probe.close()
        out = read_committed_output(bs, ends)
        for p in range(PARTITIONS):
            assert out[p] == [transform(b"%d" % i) for i in range(p, RECORDS, PARTITIONS)], (
                f"partition {p}: {len(out[p])} records, {len(set(out[p]))} distinct, "
                f"duplicated e.g. {[v for v, k in Counter(out[p]).items() if k > 1][:5]}")
        assert {tp.partition: tp.offset for tp in committed} == in_ends
    finally:
        b.stop()
