"""Speculative attempts of a write task, raced through the writer itself against a real broker.

Spark cannot be made to speculate on one machine: local mode never speculates
(`TaskSchedulerImpl`: `!isLocal && SPECULATION_ENABLED`), and on `local-cluster[2,1,1024]` the
copy of a slow task is marked speculatable but never launched, because a speculative copy may
not run on a host where an attempt of the task runs (`TaskSetManager.dequeueSpeculativeTask`)
and every executor is 127.0.0.1 (tried: "Marking task 1 in stage 1.0 as speculatable", then the
original finished after its 60 s sleep with no second attempt). So the two attempts are the
writer's `write()` run twice at once for the same task, as two executors would: the original
produces some rows and stalls, the copy runs whole; the driver commits the message Spark would
take (the first to finish)."""
from __future__ import annotations

import threading
from collections import Counter

import pyarrow as pa
import pytest
from test_exactly_once import client_values, kafka_python_values

from oncelog.spark.options import OncelogSparkError
from oncelog.spark.source import BatchWriter

N = 300


def _batches(stall: threading.Event | None = None, stalled: threading.Event | None = None):
    for first in range(0, N, 50):
        if stall is not None and first == 150:
            stalled.set()          # 150 rows handed to the producer (flushed below)
            stall.wait(60)
        yield pa.record_batch([pa.array([f"row-{i}".encode() for i in range(first, first + 50)])],
                              names=["value"])


def _committed_once(bootstrap, topic):
    for values in (client_values(bootstrap, topic, 2, "read_committed"),
                   kafka_python_values(bootstrap, topic, 2)):
        counts = Counter(values)
        assert set(counts) == {f"row-{i}".encode() for i in range(N)}
        assert max(counts.values()) == 1


def _wait_for_rows(bootstrap, topic, n):
    """Until the stalled original's rows (at least n) are in the log."""
    import time

    from oncelog.client import Consumer, TopicPartition
    with Consumer({"auto.offset.reset": "earliest", "bootstrap.servers": bootstrap}) as c:
        deadline = time.monotonic() + 60
        while sum(c.end_offsets([TopicPartition(topic, p) for p in (0, 1)]).values()) < n:
            assert time.monotonic() < deadline, "the original produced nothing"
            time.sleep(0.05)


def _race(writer, copy_first: bool):
    """(original's outcome, copy's outcome): message or exception."""
    stall, stalled = threading.Event(), threading.Event()
    out: dict = {}

    def original():
        try:
            out["original"] = writer.write(_batches(stall, stalled))
        except BaseException as e:  # noqa: BLE001 - the outcome is the test's
            out["original"] = e

    t = threading.Thread(target=original)
    t.start()
    assert stalled.wait(60)
    _wait_for_rows(writer.wo.client["bootstrap.servers"], writer.wo.topic, 100)
    if not copy_first:
        stall.set()
        t.join(120)
    try:
        out["copy"] = writer.write(_batches())
    except BaseException as e:  # noqa: BLE001
        out["copy"] = e
    stall.set()
    t.join(120)
    return out["original"], out["copy"]


def test_a_copy_started_while_the_original_runs_fences_it(spark_broker, make_topic):
    """The usual case: the copy's InitProducerId aborts the stalled original's transaction (its
    rows it produced are in the log); the original then fails (fenced) and the copy's message is the one
    the driver commits. Each row once for read_committed readers; the original's rows are only
    in the aborted transaction."""
    topic = make_topic(2)
    writer = BatchWriter({"bootstrap.servers": spark_broker, "topic": topic}, None)
    original, copy = _race(writer, copy_first=True)
    assert isinstance(original, Exception), "the fenced original must fail"
    writer.commit([copy])
    _committed_once(spark_broker, topic)
    assert len(client_values(spark_broker, topic, 2, "read_uncommitted")) >= N + 100


def test_a_copy_started_after_the_original_finished_fails_the_commit(spark_broker, make_topic):
    """Spark killed the copy too late: it fenced the original, whose message Spark took. The
    driver's commit finds that transaction aborted and raises (the job fails, or the micro-batch
    runs again on restart): nothing visible, nothing twice, never reported written."""
    topic = make_topic(2)
    writer = BatchWriter({"bootstrap.servers": spark_broker, "topic": topic}, None)
    original, _copy = _race(writer, copy_first=False)
    assert original.txn is not None
    with pytest.raises(OncelogSparkError, match="could not be committed"):
        writer.commit([original])
    writer.abort([original])
    assert client_values(spark_broker, topic, 2, "read_committed") == []
