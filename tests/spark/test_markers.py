"""The streaming sink's commit markers, read from the tail in growing windows (no Spark)."""
import json

from oncelog.client import Producer
from oncelog.spark import produce, stream_transactions


def _driver_marks(client, topic, sink, batch, entries):
    """What the sink's driver writes: in a transaction of its driver transactional id."""
    stream_transactions._write(client, sink, lambda p: produce.write_markers(p, topic, sink, batch, entries))


def test_markers_read_backwards_find_what_a_replay_needs(spark_broker, make_topic):
    topic = make_topic(1)
    client = {"bootstrap.servers": spark_broker}
    for b in range(30):
        for sink in ("A", "B"):
            if b < 29:
                _driver_marks(client, topic, sink, b, {None: (20, None)})
            else:   # batch 29 of both sinks failed: the driver's abort marked its tasks
                _driver_marks(client, topic, sink, b, {0: (10, "fp0"), 1: (10, "fp1")})
    batches, tasks = produce.read_markers(client, topic, "A", batch_id=29, window=4)
    assert tasks == {(29, 0): {"fp0"}, (29, 1): {"fp1"}} and 29 not in batches
    assert 28 in batches                      # the window grew until an earlier batch showed up
    assert len(batches) < 29                  # ...and stopped there, not at the topic's start
    all_b, all_t = produce.read_markers(client, topic, "A")
    assert all_b == set(range(29)) and all_t == {(29, 0): {"fp0"}, (29, 1): {"fp1"}}
    assert produce.read_markers(client, topic, "C", batch_id=3, window=4) == (set(), {})


def test_task_markers_without_confirmation_or_fingerprint_are_ignored(spark_broker, make_topic):
    """Earlier connector versions let each task mark itself after its input ended, which an
    attempt that Spark then failed also did: such a marker proves nothing and is not skipped.
    A confirmed marker without a fingerprint (the previous version) does not say which rows the
    task held, so no replayed task can match it."""
    topic = make_topic(1)
    client = {"bootstrap.servers": spark_broker}
    _driver_marks(client, topic, "A", 0, {None: (5, None)})
    with Producer(client) as p:
        old = {"sink": "A", "batch": 1, "task": 0, "rows": 3}
        p.send(topic, json.dumps(old).encode(), b"A", partition=0).result(30)
        unprinted = {"sink": "A", "batch": 1, "task": 2, "rows": 3, "confirmed": True}
        p.send(topic, json.dumps(unprinted).encode(), b"A", partition=0).result(30)
    _driver_marks(client, topic, "A", 1, {1: (4, "fp-a")})
    _driver_marks(client, topic, "A", 1, {1: (6, "fp-b")})   # another failed run
    assert produce.read_markers(client, topic, "A", batch_id=1) == ({0}, {(1, 1): {"fp-a", "fp-b"}})
