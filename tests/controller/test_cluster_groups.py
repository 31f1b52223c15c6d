"""Consumer groups on a cluster of brokers sharing one data directory: each group has one
coordinator (the leader of its `__consumer_offsets` partition), two librdkafka members split the
partitions, and the commits they make are what every broker's OffsetFetch answers."""
import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from test_cluster import start_cluster

pytestmark = pytest.mark.processes


def test_a_group_on_a_cluster_splits_partitions_and_commits_once(tmp_path):
    c, brokers = start_cluster(tmp_path, n=2)
    try:
        boot = ",".join(b.bootstrap for b in brokers)
        admin = AdminClient({"bootstrap.servers": boot})  # kept alive until the result is in
        admin.create_topics([NewTopic("cg", 4, 1)])["cg"].result(30)
        p = Producer({"bootstrap.servers": boot, "enable.idempotence": True})
        for i in range(400):
            p.produce("cg", value=b"%d" % i, key=b"%d" % (i % 13))
        assert p.flush(30) == 0
        seen: dict[str, list] = {"a": [], "b": []}
        assigned: dict[str, set] = {}
        stop = threading.Event()

        def member(name):
            m = Consumer({"bootstrap.servers": boot, "group.id": "cg-group", "auto.offset.reset": "earliest",
                          "enable.auto.commit": False})
            m.subscribe(["cg"])
            while not stop.is_set():
                msg = m.poll(0.1)
                if msg is not None and msg.error() is None:
                    seen[name].append(msg.value())
                    m.commit(msg, asynchronous=False)
                assigned[name] = {tp.partition for tp in m.assignment()}
            m.close()

        threads = [threading.Thread(target=member, args=(n,)) for n in "ab"]
        [t.start() for t in threads]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
                len(set(seen["a"] + seen["b"])) == 400 and assigned.get("a") and assigned.get("b")):
            time.sleep(0.1)
        stop.set()
        [t.join(30) for t in threads]
        assert sorted(set(seen["a"] + seen["b"])) == sorted(b"%d" % i for i in range(400))
        assert assigned["a"] and assigned["b"] and not assigned["a"] & assigned["b"]
        for b in brokers:  # any broker's client finds the coordinator and its commits
            check = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "cg-group"})
            committed = check.committed([TopicPartition("cg", i) for i in range(4)], timeout=30)
            ends = [check.get_watermark_offsets(TopicPartition("cg", i), timeout=30)[1] for i in range(4)]
            check.close()
            assert [tp.offset for tp in committed] == ends
    finally:
        for b in brokers:
            b.stop()
        c.stop()

