"""Consumer groups with unmodified clients: subscribe, partitions split between members, commits
that a later member of the group resumes from."""
import asyncio
import threading
import time

from test_third_party_clients import create_topic, produce_confluent, values


def test_two_confluent_members_split_the_partitions(shared_broker, unique_topic):
    from confluent_kafka import Consumer
    create_topic(shared_broker.bootstrap, unique_topic, 4)
    produce_confluent(shared_broker.bootstrap, unique_topic, values("g", 400))
    got: dict[str, list] = {}
    assignments: dict[str, set] = {}
    ready = threading.Barrier(2, timeout=30)

    def member(name):
        c = Consumer({"bootstrap.servers": shared_broker.bootstrap, "group.id": unique_topic,
                      "auto.offset.reset": "earliest", "enable.auto.commit": False})
        c.subscribe([unique_topic])
        deadline = time.monotonic() + 30
        # read until both members have a stable share and everything was read
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.setdefault(name, []).append(m.value())
            assignments[name] = {tp.partition for tp in c.assignment()}
            assigned = len(assignments.get("a", ())) + len(assignments.get("b", ()))
            if sum(len(v) for v in got.values()) >= 400 and assigned == 4:
                break
        ready.wait()
        c.close()

    threads = [threading.Thread(target=member, args=(n,)) for n in "ab"]
    [t.start() for t in threads]
    [t.join() for t in threads]
    everything = [v for vs in got.values() for v in vs]
    assert sorted(set(everything)) == sorted(values("g", 400))
    assert assignments["a"] and assignments["b"]
    assert assignments["a"] | assignments["b"] == {0, 1, 2, 3}
    assert not assignments["a"] & assignments["b"]


def test_kafka_python_group_resumes_from_its_commit(shared_broker, unique_topic):
    from kafka import KafkaConsumer
    create_topic(shared_broker.bootstrap, unique_topic, 2)
    produce_confluent(shared_broker.bootstrap, unique_topic, values("k", 300))
    c = KafkaConsumer(unique_topic, bootstrap_servers=shared_broker.bootstrap, group_id=unique_topic,
                      auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=5000)
    first = [m.value for m in c]
    c.commit()
    c.close()
    assert sorted(first) == sorted(values("k", 300))
    produce_confluent(shared_broker.bootstrap, unique_topic, values("k2", 50))
    c = KafkaConsumer(unique_topic, bootstrap_servers=shared_broker.bootstrap, group_id=unique_topic,
                      auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=3000)
    second = [m.value for m in c]
    c.close()
    assert sorted(second) == sorted(values("k2", 50))


def test_aiokafka_group_consumes_and_commits(shared_broker, unique_topic):
    from aiokafka import AIOKafkaConsumer, TopicPartition
    create_topic(shared_broker.bootstrap, unique_topic, 3)
    produce_confluent(shared_broker.bootstrap, unique_topic, values("a", 300))

    async def go():
        c = AIOKafkaConsumer(unique_topic, bootstrap_servers=shared_broker.bootstrap, group_id=unique_topic,
                             auto_offset_reset="earliest", enable_auto_commit=False)
        await c.start()
        try:
            n, deadline = 0, time.monotonic() + 30
            while n < 300 and time.monotonic() < deadline:
                n += sum(len(v) for v in (await c.getmany(timeout_ms=500)).values())
            await c.commit()
            committed = [await c.committed(TopicPartition(unique_topic, p)) for p in range(3)]
            return n, committed
        finally:
            await c.stop()

    n, committed = asyncio.run(go())
    assert n == 300
    assert sum(committed) == 300


def test_restarted_static_confluent_member_gets_its_partitions_back_without_a_rebalance(
        shared_broker, unique_topic):
    """KIP-345 with librdkafka: a static member (group.instance.id) closes without leaving and a
    new process with the same instance id takes its place; the other member sees no rebalance."""
    from confluent_kafka import Consumer
    create_topic(shared_broker.bootstrap, unique_topic, 4)
    produce_confluent(shared_broker.bootstrap, unique_topic, values("s", 40))
    events: dict[str, list] = {"a": [], "b": [], "a2": []}

    def consumer(name: str, instance: str) -> Consumer:
        c = Consumer({"bootstrap.servers": shared_broker.bootstrap, "group.id": unique_topic,
                      "group.instance.id": instance, "session.timeout.ms": 45000,
                      "auto.offset.reset": "earliest", "enable.auto.commit": False})
        c.subscribe([unique_topic],
                    on_assign=lambda _c, ps: events[name].append(("assign", {p.partition for p in ps})),
                    on_revoke=lambda _c, ps: events[name].append(("revoke", {p.partition for p in ps})))
        return c

    def poll_until(consumers, done, deadline_s=40.0):
        end = time.monotonic() + deadline_s
        while time.monotonic() < end and not done():
            for c in consumers:
                c.poll(0.1)
        assert done(), events

    a, b = consumer("a", "inst-a"), consumer("b", "inst-b")
    split = lambda: (events["a"] and events["b"] and events["a"][-1][0] == "assign"  # noqa: E731
                     and events["b"][-1][0] == "assign"
                     and len(events["a"][-1][1]) + len(events["b"][-1][1]) == 4)
    poll_until([a, b], split)
    a_partitions, b_events = events["a"][-1][1], len(events["b"])
    a.close()  # a static member does not send LeaveGroup: the broker keeps its place
    a2 = consumer("a2", "inst-a")
    poll_until([a2, b], lambda: bool(events["a2"]))
    for _ in range(20):  # b keeps polling for a while: nothing must happen to it
        b.poll(0.1)
    assert events["a2"] == [("assign", a_partitions)]
    assert len(events["b"]) == b_events, events["b"]
    a2.close()
    b.close()
