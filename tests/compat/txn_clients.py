"""One transactional producer and one read_committed consumer per client library, behind the same
calls, so that tests/compat/test_transactions.py asks confluent-kafka (librdkafka), kafka-python,
aiokafka and kafkajs the same questions and judges their answers in one place.

Records are (partition, value) pairs. Each call runs the client's own API the way its docs show
(kafkajs through tests/compat/kafkajs_txn.js) and returns what the client said; nothing here
decides whether the broker was right.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

Records = list[tuple[int, bytes]]
READ_DEADLINE_S = 60


def _read_until(poll, count: int) -> Records:
    """Call `poll()` (a list of records each time) until `count` records came or the deadline."""
    got: Records = []
    deadline = time.monotonic() + READ_DEADLINE_S
    while len(got) < count and time.monotonic() < deadline:
        got += poll()
    return got


class ConfluentKafka:
    name = "confluent-kafka"

    def _producer(self, bs: str, tid: str):
        from confluent_kafka import Producer
        p = Producer({"bootstrap.servers": bs, "transactional.id": tid, "linger.ms": 0})
        p.init_transactions(30)
        return p

    def commit_abort(self, bs: str, topic: str, tid: str, aborted: Records, committed: Records) -> None:
        p = self._producer(bs, tid)
        p.begin_transaction()
        for part, value in aborted:
            p.produce(topic, value=value, partition=part)
        p.flush(30)  # else abort_transaction purges them unsent and, nothing added, sends no EndTxn
        p.abort_transaction(30)
        p.begin_transaction()
        for part, value in committed:
            p.produce(topic, value=value, partition=part)
        p.commit_transaction(30)

    def fence(self, bs: str, topic: str, tid: str):
        from confluent_kafka import KafkaException
        first = self._producer(bs, tid)
        first.begin_transaction()
        first.produce(topic, value=b"zombie", partition=0)
        first.flush(30)
        second = self._producer(bs, tid)  # fences: the open transaction is aborted at a new epoch
        try:
            first.commit_transaction(30)
            err = None
        except KafkaException as e:
            err = e.args[0]
        second.begin_transaction()
        second.produce(topic, value=b"new", partition=0)
        second.commit_transaction(30)
        return err

    def is_fenced(self, err) -> bool:
        from confluent_kafka import KafkaError
        return err is not None and err.fatal() and err.code() in (
            KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)

    def read_committed(self, bs: str, topic: str, partitions: int, count: int) -> Records:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
        c = Consumer({"bootstrap.servers": bs, "group.id": str(uuid.uuid4()), "enable.auto.commit": False,
                      "isolation.level": "read_committed"})
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])

        def poll() -> Records:
            m = c.poll(0.2)
            return [] if m is None or m.error() else [(m.partition(), m.value())]
        try:
            return _read_until(poll, count)
        finally:
            c.close()


class KafkaPython:
    name = "kafka-python"

    def _producer(self, bs: str, tid: str):
        from kafka import KafkaProducer
        p = KafkaProducer(bootstrap_servers=bs, transactional_id=tid)
        p.init_transactions()
        return p

    def _send(self, p, topic: str, records: Records) -> None:
        for f in [p.send(topic, value, partition=part) for part, value in records]:
            f.get(30)

    def commit_abort(self, bs: str, topic: str, tid: str, aborted: Records, committed: Records) -> None:
        p = self._producer(bs, tid)
        try:
            p.begin_transaction()
            self._send(p, topic, aborted)
            p.abort_transaction()
            p.begin_transaction()
            for part, value in committed:
                p.send(topic, value, partition=part)
            p.commit_transaction()
        finally:
            p.close(timeout=10)

    def fence(self, bs: str, topic: str, tid: str):
        from kafka.errors import KafkaError
        first = self._producer(bs, tid)
        first.begin_transaction()
        self._send(first, topic, [(0, b"zombie")])
        second = self._producer(bs, tid)
        try:
            first.commit_transaction()
            err = None
        except KafkaError as e:
            err = e
        finally:
            first.close(timeout=10)
        try:
            second.begin_transaction()
            second.send(topic, b"new", partition=0)
            second.commit_transaction()
        finally:
            second.close(timeout=10)
        return err

    def is_fenced(self, err) -> bool:
        from kafka.errors import ProducerFencedError
        return isinstance(err, ProducerFencedError)

    def read_committed(self, bs: str, topic: str, partitions: int, count: int) -> Records:
        from kafka import KafkaConsumer, TopicPartition
        c = KafkaConsumer(bootstrap_servers=bs, group_id=None, enable_auto_commit=False,
                          auto_offset_reset="earliest", isolation_level="read_committed")
        c.assign([TopicPartition(topic, p) for p in range(partitions)])

        def poll() -> Records:
            return [(m.partition, m.value) for ms in c.poll(timeout_ms=200).values() for m in ms]
        try:
            return _read_until(poll, count)
        finally:
            c.close()


class AIOKafka:
    name = "aiokafka"

    async def _producer(self, bs: str, tid: str):
        from aiokafka import AIOKafkaProducer
        p = AIOKafkaProducer(bootstrap_servers=bs, transactional_id=tid)
        await p.start()  # InitProducerId happens here
        return p

    def commit_abort(self, bs: str, topic: str, tid: str, aborted: Records, committed: Records) -> None:
        async def run():
            p = await self._producer(bs, tid)
            try:
                await p.begin_transaction()
                for part, value in aborted:
                    await p.send_and_wait(topic, value, partition=part)
                await p.abort_transaction()
                async with p.transaction():
                    for part, value in committed:
                        await p.send(topic, value, partition=part)
            finally:
                await p.stop()
        asyncio.run(run())

    def fence(self, bs: str, topic: str, tid: str):
        from aiokafka.errors import KafkaError

        async def run():
            first = await self._producer(bs, tid)
            await first.begin_transaction()
            await first.send_and_wait(topic, b"zombie", partition=0)
            second = await self._producer(bs, tid)
            try:
                await first.commit_transaction()
                err = None
            except KafkaError as e:
                err = e
            finally:
                await first.stop()
            try:
                async with second.transaction():
                    await second.send_and_wait(topic, b"new", partition=0)
            finally:
                await second.stop()
            return err
        return asyncio.run(run())

    def is_fenced(self, err) -> bool:
        from aiokafka.errors import ProducerFenced  # its name for INVALID_PRODUCER_EPOCH on EndTxn v0
        return isinstance(err, ProducerFenced)

    def read_committed(self, bs: str, topic: str, partitions: int, count: int) -> Records:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        async def run():
            c = AIOKafkaConsumer(bootstrap_servers=bs, enable_auto_commit=False, auto_offset_reset="earliest",
                                 isolation_level="read_committed")
            await c.start()
            try:
                c.assign([TopicPartition(topic, p) for p in range(partitions)])
                got: Records = []
                deadline = time.monotonic() + READ_DEADLINE_S
                while len(got) < count and time.monotonic() < deadline:
                    batch = await c.getmany(timeout_ms=200)
                    got += [(m.partition, m.value) for ms in batch.values() for m in ms]
                return got
            finally:
                await c.stop()
        return asyncio.run(run())


class KafkaJS:
    name = "kafkajs"

    def __init__(self, node_path: Path) -> None:
        self.node_path = node_path

    def _run(self, *args: str) -> dict:
        from test_kafkajs import run_node
        return run_node(self.node_path, "kafkajs_txn.js", *args, timeout_s=120)

    @staticmethod
    def _pairs(records: Records) -> str:
        import json
        return json.dumps([[part, value.decode()] for part, value in records])

    def commit_abort(self, bs: str, topic: str, tid: str, aborted: Records, committed: Records) -> None:
        self._run(bs, "commit-abort", topic, tid, self._pairs(aborted), self._pairs(committed))

    def fence(self, bs: str, topic: str, tid: str):
        return self._run(bs, "fence", topic, tid)["fenced"]

    def is_fenced(self, err) -> bool:
        # kafkajs speaks EndTxn v0-1: PRODUCER_FENCED reaches it as INVALID_PRODUCER_EPOCH
        return err is not None and err["type"] in ("INVALID_PRODUCER_EPOCH", "PRODUCER_FENCED") \
            and not err["retriable"]

    def read_committed(self, bs: str, topic: str, partitions: int, count: int) -> Records:
        out = self._run(bs, "read", topic, f"read-{uuid.uuid4()}", str(count))
        return [(part, value.encode()) for part, value in out["records"]]

    def send_offsets(self, bs: str, topic: str, tid: str, group: str, offset: int) -> None:
        self._run(bs, "send-offsets", topic, tid, group, str(offset))


PYTHON_CLIENTS = {c.name: c for c in (ConfluentKafka, KafkaPython, AIOKafka)}
CLIENTS = [*PYTHON_CLIENTS, KafkaJS.name]
