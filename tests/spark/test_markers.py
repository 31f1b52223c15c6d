"""The streaming sink's commit markers, read from the tail in growing windows (no Spark)."""
from oncelog.client import Producer
from oncelog.spark import produce


def test_markers_read_backwards_find_what_a_replay_needs(spark_broker, make_topic):
    topic = make_topic(1)
    client = {"bootstrap.servers": spark_broker}
    with Producer(client) as p:
        for b in range(30):
            for sink in ("A", "B"):
                for task in range(2):
                    produce.write_marker(p, topic, sink, b, task, 10)
                if b < 29:      # batch 29 of both sinks: tasks wrote, commit failed
                    produce.write_marker(p, topic, sink, b, None, 20)
    batches, tasks = produce.read_markers(client, topic, "A", batch_id=29, window=4)
    assert (29, 0) in tasks and (29, 1) in tasks and 29 not in batches
    assert 28 in batches                      # the window grew until an earlier batch showed up
    assert len(batches) < 29                  # ...and stopped there, not at the topic's start
    all_b, all_t = produce.read_markers(client, topic, "A")
    assert all_b == set(range(29)) and all_t == {(b, t) for b in range(30) for t in range(2)}
    assert produce.read_markers(client, topic, "C", batch_id=3, window=4) == (set(), set())
