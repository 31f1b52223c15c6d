"""Exactly-once writes (issue 17): a transaction per write task, completed by the driver.

On local[2,3] (Spark retries a failed task): a UDF failing the first attempt of a task after it
produced rows, a driver dying between the tasks' commit and Spark's checkpoint commit (and in
the middle of committing), a replay of a batch whose transactions were all committed, a replay
split differently after a partial commit (issue 24), a batch job failing after tasks finished.
In every case read_committed readers, oncelog's (through Spark and the client) and
kafka-python's, see each row exactly once; with `deliveryGuarantee=at-least-once` the failing
UDF shows the duplicates the transactions remove. That the failed attempt really produced rows
is checked with read_uncommitted, and a run where the retry fenced it first is run again
(failing_udf.py says why that race exists)."""
from __future__ import annotations

import os
import time
from collections import Counter

import pytest
from failing_udf import failing_udf, until_the_failed_attempt_produced

from conftest import read_topic

ROWS = 200           # per source partition
STEP = 100           # maxOffsetsPerTrigger 200 over 2 partitions: ranges [0,100), [100,200)
FAIL_AT = 60
PAD = b"." * 2000
COMMITTED = {"kafka.isolation.level": "read_committed"}


@pytest.fixture
def small_batches(spark_retry):
    spark_retry.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")
    yield spark_retry
    spark_retry.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")


def _source(produce, make_topic):
    src = make_topic(2)
    for p in (0, 1):
        produce(src, [f"{p}:{i}:".encode() + PAD for i in range(ROWS)], partition=p)
    return src


def _failing(attempts, fail_partition=1):
    """value (and the source partition, so a task writes the partition it reads), through a
    Python UDF raising in the given attempts of the task reading `fail_partition` at offset
    % STEP == FAIL_AT."""
    return failing_udf(attempts, fail_partition=fail_partition, step=STEP, fail_at=FAIL_AT)


def _ids(values) -> Counter:
    return Counter(v.split(b":", 2)[0] + b":" + v.split(b":", 2)[1] for v in values)


def client_values(bootstrap, topic, partitions, isolation):
    """Everything oncelog's consumer reads up to the end offsets of `isolation` (LSO for
    read_committed)."""
    from oncelog.client import Consumer, TopicPartition
    c = Consumer({"auto.offset.reset": "earliest", "bootstrap.servers": bootstrap, "isolation.level": isolation})
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        ends = c.end_offsets(tps)
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while any((c.position(tp) or 0) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, "reading did not reach the end offsets"
            got.extend(r.value for r in c.poll(0.3))
        return got
    finally:
        c.close()


def kafka_python_values(bootstrap, topic, partitions):
    """kafka-python's read_committed consumer, up to the last stable offsets."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP
    c = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                      enable_auto_commit=False, consumer_timeout_ms=2000)
    try:
        tps = [KTP(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        ends = c.end_offsets(tps)
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while any(c.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, "kafka-python did not reach the end offsets"
            for recs in c.poll(500).values():
                got.extend(r.value for r in recs)
        return got
    finally:
        c.close()


def assert_exactly_once(spark, bootstrap, dst, partitions=2, expect=None):
    """Each source event exactly once for every read_committed reader; returns what a
    read_uncommitted reader sees (aborted attempts included)."""
    expect = expect if expect is not None else {f"{p}:{i}".encode() for p in (0, 1)
                                                for i in range(ROWS)}
    via_spark = [r["value"] for r in read_topic(spark, bootstrap, dst, **COMMITTED)
                 .select("value").collect()]
    for name, values in (("spark read_committed", via_spark),
                         ("oncelog read_committed", client_values(bootstrap, dst, partitions,
                                                                  "read_committed")),
                         ("kafka-python read_committed",
                          kafka_python_values(bootstrap, dst, partitions))):
        counts = _ids(values)
        assert set(counts) == expect, f"{name}: {len(expect - set(counts))} missing"
        dup = {k: n for k, n in counts.items() if n > 1}
        assert not dup, f"{name}: {len(dup)} duplicated, e.g. {sorted(dup)[:5]}"
    return _ids(client_values(bootstrap, dst, partitions, "read_uncommitted"))


def _stream(spark, bootstrap, src, dst, ckpt, select, write_opts, source=None, **sink):
    w = (spark.readStream.format("oncelog").option("bootstrap.servers", bootstrap)
         .option("subscribe", src).option("startingOffsets", "earliest")
         .option("maxOffsetsPerTrigger", str(2 * STEP)).options(**(source or {})).load()
         .select(*select).writeStream.format("oncelog").options(**write_opts)
         .option("topic", dst).option("checkpointLocation", ckpt).trigger(availableNow=True))
    for k, v in sink.items():
        w = w.option(k, v)
    return w.start()


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_udf_failing_a_first_attempt_after_it_produced(small_batches, spark_broker, make_topic,
                                                       produce, write_opts, tmp_path, guarantee):
    spark = small_batches
    runs = iter(range(10))

    def scenario() -> bool:
        src, dst = _source(produce, make_topic), make_topic(2)
        q = _stream(spark, spark_broker, src, dst, str(tmp_path / f"ckpt{next(runs)}"), _failing({0}),
                    write_opts, deliveryGuarantee=guarantee)
        q.awaitTermination()
        assert q.exception() is None
        if guarantee == "at-least-once":
            # the same run without transactions: the failed attempts' rows stay, a reader that
            # cannot tell them apart sees them twice (what the transactions remove)
            counts = _ids(client_values(spark_broker, dst, 2, "read_committed"))
            assert any(n > 1 for n in counts.values())
            return True
        uncommitted = assert_exactly_once(spark, spark_broker, dst)
        # the failed attempts had produced rows (aborted, seen only by read_uncommitted readers)
        return any(n > 1 for n in uncommitted.values())
    until_the_failed_attempt_produced(scenario)


@pytest.mark.parametrize("sink_id", [False, True])
def test_batch_write_with_a_retried_task_writes_once(small_batches, spark_broker, make_topic,
                                                     produce, write_opts, sink_id):
    """With a sinkId every attempt has a transaction of its own (two-phase commit on this
    broker: no timeout ends it), so the driver must abort the failed attempt's: nothing may be
    left open holding read_committed readers back."""
    spark = small_batches

    def scenario() -> bool:
        src, dst = _source(produce, make_topic), make_topic(2)
        (read_topic(spark, spark_broker, src).select(*_failing({0}))
         .write.format("oncelog").options(**write_opts).option("topic", dst)
         .options(**({"sinkId": f"job-{dst}"} if sink_id else {})).mode("append").save())
        uncommitted = assert_exactly_once(spark, spark_broker, dst)
        assert _stable(spark_broker, dst, 2), "a transaction of the job is still open"
        return any(n > 1 for n in uncommitted.values())
    until_the_failed_attempt_produced(scenario)


def test_a_batch_write_with_a_sink_id_writes_once_however_often_it_runs(spark, spark_broker, make_topic,
                                                                         produce, write_opts):
    """A sinkId names one write: run again after it completed, the job writes nothing; without
    one every run writes its rows (as before sinkId meant anything to a batch write); with
    at-least-once, which records nothing a rerun could find, the option is refused."""
    src, once, each = _source(produce, make_topic), make_topic(2), make_topic(2)
    df = read_topic(spark, spark_broker, src).select("value", "partition")
    for _ in range(2):
        df.write.format("oncelog").options(**write_opts).option("topic", once) \
            .option("sinkId", f"job-{once}").mode("append").save()
        df.write.format("oncelog").options(**write_opts).option("topic", each).mode("append").save()
    assert_exactly_once(spark, spark_broker, once)
    assert _stable(spark_broker, once, 2), "a transaction of the job is still open"
    assert set(_ids(client_values(spark_broker, each, 2, "read_committed")).values()) == {2}
    with pytest.raises(Exception, match="sinkId on a batch write needs deliveryGuarantee=exactly-once"):
        df.write.format("oncelog").options(**write_opts).option("topic", once) \
            .option("sinkId", f"job-{once}-2").option("deliveryGuarantee", "at-least-once") \
            .mode("append").save()


def _stable(bootstrap, topic, partitions):
    """The last stable offsets equal the high watermarks (no transaction left open) before a
    deadline: True, else False."""
    from oncelog.client import Consumer, TopicPartition
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with Consumer({"auto.offset.reset": "earliest",
                   "bootstrap.servers": bootstrap, "isolation.level": "read_committed"}) as rc, \
            Consumer({"auto.offset.reset": "earliest", "bootstrap.servers": bootstrap}) as ru:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if rc.end_offsets(tps) == ru.end_offsets(tps):
                return True
            time.sleep(0.2)
    return False


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_batch_job_failing_after_tasks_finished_leaves_nothing_visible(
        spark, spark_broker, make_topic, produce, write_opts, tmp_path, guarantee):
    """local[2]: the task of source partition 1 fails after producing 60 rows and fails the job;
    the task of partition 0 has produced (or finished). read_committed readers see nothing, and
    no transaction is left open (the driver's abort aborts the finished tasks' transactions and
    fences the failed task's id), so the last stable offset is not held back."""
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")

    def scenario() -> bool:
        src, dst = _source(produce, make_topic), make_topic(2)
        with pytest.raises(Exception, match="injected UDF failure"):
            (read_topic(spark, spark_broker, src).select(*_failing({0}))
             .write.format("oncelog").options(**write_opts).option("topic", dst)
             .option("deliveryGuarantee", guarantee).mode("append").save())
        if guarantee == "at-least-once":
            # without transactions the failed job's rows stay visible to every reader
            return bool(client_values(spark_broker, dst, 2, "read_committed"))
        assert _stable(spark_broker, dst, 2), "a transaction of the failed job is still open"
        assert client_values(spark_broker, dst, 2, "read_committed") == []
        assert kafka_python_values(spark_broker, dst, 2) == []
        assert read_topic(spark, spark_broker, dst, **COMMITTED).count() == 0
        # a task had produced before the job failed (else nothing above was at stake)
        return bool(client_values(spark_broker, dst, 2, "read_uncommitted"))
    try:
        until_the_failed_attempt_produced(scenario)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")


@pytest.mark.parametrize("protocol", ["v2", pytest.param("v1", marks=pytest.mark.slow)])
def test_driver_dying_while_committing_then_restarted(small_batches, spark_broker, make_topic,
                                                      produce, write_opts, tmp_path, protocol):
    """Batch 1's driver records the batch's two task transactions, commits the older one and
    dies before the other (and before the batch marker and Spark's commit log). A
    read_committed reader then sees one task's rows of batch 1 and none of the other's: the
    batch is not atomic across tasks, each row is seen at most once. The restarted query
    replays batch 1: its tasks find the recorded decision and write nothing, its driver commits
    the recorded transaction still open, at the epoch its task used: each row exactly once.
    Tasks and driver speak Transactions V2 (the default) or V1."""
    spark = small_batches
    if protocol == "v1":
        write_opts = {**write_opts, "kafka.oncelog.transaction.v2.enable": "false"}
    src, dst = _source(produce, make_topic), make_topic(2)
    ckpt = str(tmp_path / "ckpt")
    q = _stream(spark, spark_broker, src, dst, ckpt, _failing(set()), write_opts,
                _crashInCommit="1:1")
    with pytest.raises(Exception, match="injected driver crash"):
        q.awaitTermination()
    assert sorted(f for f in os.listdir(os.path.join(ckpt, "commits")) if f.isdigit()) == ["0"]
    seen = _ids(client_values(spark_broker, dst, 2, "read_committed"))
    # batch 0 whole, one task of batch 1 (a source partition's offsets 100-199), nothing of
    # the other
    batch0 = {f"{p}:{i}".encode() for p in (0, 1) for i in range(STEP)}
    assert set(seen) in [batch0 | {f"{p}:{i}".encode() for i in range(STEP, 2 * STEP)}
                         for p in (0, 1)]
    assert max(seen.values()) == 1

    q = _stream(spark, spark_broker, src, dst, ckpt, _failing(set()), write_opts)
    q.awaitTermination()
    assert q.exception() is None
    assert_exactly_once(spark, spark_broker, dst)


def test_replay_of_a_batch_whose_transactions_were_all_committed(
        spark_retry, spark_broker, make_topic, produce, write_opts, tmp_path):
    """The driver completed every transaction of batch 1 and died before the batch marker and
    Spark's commit log: the replay's tasks find the batch's decision and write nothing (they
    open no transaction either), its driver's commits are answered NONE."""
    spark = spark_retry
    src, dst = _source(produce, make_topic), make_topic(2)
    ckpt = str(tmp_path / "ckpt")
    q = _stream(spark, spark_broker, src, dst, ckpt, _failing(set()), write_opts,
                _crashInCommit="1:2")
    with pytest.raises(Exception, match="injected driver crash"):
        q.awaitTermination()
    q = _stream(spark, spark_broker, src, dst, ckpt, _failing(set()), write_opts)
    q.awaitTermination()
    assert q.exception() is None
    uncommitted = assert_exactly_once(spark, spark_broker, dst)
    assert sum(uncommitted.values()) == 2 * ROWS    # the replay produced nothing


@pytest.mark.parametrize("first_split, replay_split", [("4", None), (None, "4")],
                         ids=["4-tasks-then-2", "2-tasks-then-4"])
def test_replay_split_differently_after_a_partial_commit(
        small_batches, spark_broker, make_topic, produce, write_opts, tmp_path, first_split,
        replay_split):
    """Issue 24, finding 5: batch 1's driver commits some of its task transactions and dies;
    the replay splits the batch differently (minPartitions added or dropped), so no replayed
    task holds the rows of a task of the first run. The replay writes nothing: its driver
    commits the transactions the first driver had recorded, and every row is there once."""
    spark = small_batches
    src, dst = _source(produce, make_topic), make_topic(2)
    ckpt = str(tmp_path / "ckpt")

    def split(n):
        return {"minPartitions": n} if n else {}

    tasks = 4 if first_split else 2
    q = _stream(spark, spark_broker, src, dst, ckpt, _failing(set()), write_opts,
                split(first_split), _crashInCommit=f"1:{tasks // 2}")
    with pytest.raises(Exception, match="injected driver crash"):
        q.awaitTermination()
    seen = _ids(client_values(spark_broker, dst, 2, "read_committed"))
    # batch 0 and half of batch 1 (tasks of 50 or 100 rows)
    assert sum(seen.values()) == 2 * STEP + STEP and max(seen.values()) == 1

    q = _stream(spark, spark_broker, src, dst, ckpt, _failing(set()), write_opts,
                split(replay_split))
    q.awaitTermination()
    assert q.exception() is None
    uncommitted = assert_exactly_once(spark, spark_broker, dst)
    # the replay produced nothing (no aborted copy of batch 1 either)
    assert sum(uncommitted.values()) == 2 * ROWS


def test_another_principal_cannot_make_the_query_skip_a_batch(spark, spark_broker, make_topic, produce,
                                                              write_opts, tmp_path):
    """Issue 35's forgery: alice, who may write the shared marker topic as every sink's principal
    must, appends bob's "batch 1 committed" and "batch 1 decided (no transactions)" records, as
    plain records and in a committed transaction of her own. Only records in committed
    transactions of bob's driver transactional id count: bob's query writes batch 1 all the
    same (before the fix it skipped it: 200 rows lost)."""
    import json
    import uuid

    from oncelog.client import Producer
    from oncelog.spark import produce as sink_produce
    from oncelog.spark.options import MARKER_TOPIC
    src, dst = _source(produce, make_topic), make_topic(2)
    sink = f"bob-{uuid.uuid4().hex[:8]}"
    sink_produce.ensure_marker_topic({"bootstrap.servers": spark_broker}, MARKER_TOPIC)
    forged = [json.dumps(m, sort_keys=True).encode() for m in (
        {"sink": sink, "batch": 1, "task": None, "rows": 0},
        {"sink": sink, "batch": 1, "decision": [], "rows": 0},
        {"sink": sink, "batch": 1, "task": 0, "rows": 0, "confirmed": True, "fingerprint": "x"})]
    with Producer({"bootstrap.servers": spark_broker}) as alice:
        for v in forged:
            alice.send(MARKER_TOPIC, v, sink.encode(), partition=0)
        alice.flush()
    with Producer({"bootstrap.servers": spark_broker, "transactional.id": "alice-forger"}) as alice:
        alice.init_transactions(30)
        alice.begin_transaction()
        for v in forged:
            alice.send(MARKER_TOPIC, v, sink.encode(), partition=0)
        alice.commit_transaction(30)
    q = _stream(spark, spark_broker, src, dst, str(tmp_path / "ckpt"), _failing(set()), write_opts,
                sinkId=sink)
    q.awaitTermination()
    assert q.exception() is None
    assert_exactly_once(spark, spark_broker, dst)
