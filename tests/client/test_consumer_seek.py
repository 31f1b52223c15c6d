"""Where a consumer reads after a seek or a revocation: never records it fetched for the old
position. A rewind (an aborted consume-transform-produce transaction going back to the group's
committed offsets) that was followed by records fetched before it duplicated them in the output;
a seek during a Fetch in flight must not let that Fetch's answer move the new position; a revoked
partition's fetched records belong to the member it moves to, and no record of it comes out of
poll once its on_revoke has run (the application commits there what it has processed)."""
from __future__ import annotations

import asyncio
import time

from oncelog.client import AdminClient, Consumer, Producer
from oncelog.client.aio.consumer import AIOConsumer
from oncelog.client.types import TopicPartition


def _produce(bootstrap: str, topic: str, n: int, partitions: int = 1) -> None:
    with Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True}) as p:
        for i in range(n):
            p.send(topic, b"%d" % i, partition=i % partitions)
        p.flush(60)


def _topic(bootstrap: str, name: str, partitions: int = 1) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        admin.create_topics([name], num_partitions=partitions)[name].result()
    finally:
        admin.close()
    return name


def test_a_seek_back_drops_the_records_fetched_before_it(shared_broker, unique_topic):
    topic = _topic(shared_broker.bootstrap, unique_topic)
    _produce(shared_broker.bootstrap, topic, 500)
    tp = TopicPartition(topic, 0)
    with Consumer({"auto.offset.reset": "earliest", "bootstrap.servers": shared_broker.bootstrap}) as c:
        c.assign([TopicPartition(topic, 0, 0)])
        first = c.poll(10, max_records=10)
        assert [r.offset for r in first] == list(range(10))   # the rest of the fetch is buffered
        c.seek(tp, 0)
        again = c.poll(10, max_records=10)
        assert [r.offset for r in again] == list(range(10))
        c.seek(tp, 300)                                        # forward, past what is buffered
        ahead = c.poll(10, max_records=5)
        assert [r.offset for r in ahead] == list(range(300, 305))


async def test_a_fetch_in_flight_during_a_seek_does_not_move_the_new_position(shared_broker, unique_topic):
    topic = _topic(shared_broker.bootstrap, unique_topic)
    _produce(shared_broker.bootstrap, topic, 10)
    tp = TopicPartition(topic, 0)
    c = AIOConsumer({"auto.offset.reset": "earliest",
                     "bootstrap.servers": shared_broker.bootstrap, "fetch.max.wait.ms": 20000})
    await c.start()
    try:
        c.assign([TopicPartition(topic, 0, 10)])     # at the end: the Fetch waits for a record
        assert await c.poll(0.2) == []               # metadata and the leader's connection are known now
        polling = asyncio.ensure_future(c.poll(30))
        deadline = time.monotonic() + 10
        while not any(conn.in_flight for conn in c.cluster.conns.values()):
            assert time.monotonic() < deadline, "the Fetch was never sent"
            await asyncio.sleep(0.01)
        c.seek(tp, 0)
        await asyncio.to_thread(_produce, shared_broker.bootstrap, topic, 1)   # answers that Fetch
        records = await asyncio.wait_for(polling, 30)
        assert [r.offset for r in records][:3] == [0, 1, 2], [r.offset for r in records]
    finally:
        await c.close()


def test_records_fetched_for_a_revoked_partition_are_not_returned(shared_broker, unique_topic):
    a = _topic(shared_broker.bootstrap, unique_topic + "-a")
    b = _topic(shared_broker.bootstrap, unique_topic + "-b")
    _produce(shared_broker.bootstrap, a, 5000)
    _produce(shared_broker.bootstrap, b, 10)
    revoked: list[TopicPartition] = []
    late: list[tuple[str, int]] = []
    with Consumer({"bootstrap.servers": shared_broker.bootstrap, "group.id": unique_topic,
                   "group.protocol": "consumer", "enable.auto.commit": False,
                   "auto.offset.reset": "earliest"}) as c:
        c.subscribe([a], on_revoke=lambda _c, tps: revoked.extend(tps))
        deadline = time.monotonic() + 30
        while not c.poll(0.5, max_records=1):
            assert time.monotonic() < deadline, "never assigned"
        c.subscribe([b], on_revoke=lambda _c, tps: revoked.extend(tps))   # takes `a` away
        got_b = False
        while not got_b:
            assert time.monotonic() < deadline, (revoked, late)
            for r in c.poll(0.2, max_records=1):
                got_b = got_b or r.topic == b
                if revoked and r.topic == a:
                    late.append((r.topic, r.offset))
        assert TopicPartition(a, 0) in revoked
        assert late == []
