"""Structured Streaming through format("oncelog"): checkpoint restarts, admission control, and
the sink's replay idempotence (on local[2], and local[2,3] where failed tasks are retried)."""
import json
import os

import pytest

from conftest import read_topic


def _stream(spark, bootstrap, topic, **options):
    r = (spark.readStream.format("oncelog").option("bootstrap.servers", bootstrap)
         .option("subscribe", topic).option("startingOffsets", "earliest"))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def _run(query):
    query.awaitTermination()
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"] > 0]


def test_restart_from_checkpoint_reads_every_record_once(spark, spark_broker, make_topic,
                                                         produce, tmp_path):
    topic = make_topic(2)
    produce(topic, [f"first-{i}".encode() for i in range(300)])
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")

    def run():
        q = (_stream(spark, spark_broker, topic).selectExpr("partition", "offset", "value")
             .writeStream.format("parquet").option("path", out).option("checkpointLocation", ckpt)
             .trigger(availableNow=True).start())
        return _run(q)

    assert sum(run()) == 300
    produce(topic, [f"second-{i}".encode() for i in range(200)])
    assert sum(run()) == 200          # only the new records
    assert run() == []                # nothing new: no rows at all
    rows = spark.read.parquet(out).collect()
    assert len(rows) == 500
    assert len({(r["partition"], r["offset"]) for r in rows}) == 500
    assert sorted(r["value"] for r in rows) == sorted(
        [f"first-{i}".encode() for i in range(300)] + [f"second-{i}".encode() for i in range(200)])
    # Spark stored our offsets verbatim: canonical JSON, sorted partitions
    last = max((f for f in os.listdir(os.path.join(ckpt, "offsets")) if f.isdigit()), key=int)
    stored = open(os.path.join(ckpt, "offsets", last)).read().splitlines()[-1]
    assert list(json.loads(stored)[topic]) == ["0", "1"]


def test_running_query_stopped_midway_and_restarted_reads_every_record_once(
        spark, spark_broker, make_topic, produce, tmp_path):
    import time
    topic = make_topic(2)
    produce(topic, [f"m{i}".encode() for i in range(1000)])
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")

    def start(**trigger):
        return (_stream(spark, spark_broker, topic, maxOffsetsPerTrigger="100")
                .selectExpr("partition", "offset", "value").writeStream.format("parquet")
                .option("path", out).option("checkpointLocation", ckpt).trigger(**trigger).start())

    q = start(processingTime="0 seconds")
    deadline = time.monotonic() + 120
    while sum(p["numInputRows"] for p in q.recentProgress) < 300:
        assert q.isActive and time.monotonic() < deadline, q.exception()
        q.awaitTermination(0.2)
    q.stop()                                   # mid-stream, wherever it happens to be
    first = sum(p["numInputRows"] for p in q.recentProgress)
    assert first >= 300
    rest = sum(_run(start(availableNow=True)))
    rows = spark.read.parquet(out).collect()
    assert len(rows) == 1000 and len({(r["partition"], r["offset"]) for r in rows}) == 1000
    # the restart resumed from the checkpoint (progress events of the stopped query may lag, so
    # `first` can undercount; the stored rows above are the exactly-once proof)
    assert rest < 1000


def test_stream_default_starts_at_latest_and_reads_headers(spark, spark_broker, make_topic,
                                                          produce, tmp_path):
    from oncelog.client import Producer
    topic = make_topic(1)
    produce(topic, [b"before"] * 5)
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")

    def run():
        q = (spark.readStream.format("oncelog").option("bootstrap.servers", spark_broker)
             .option("subscribe", topic).option("includeHeaders", "true").load()
             .selectExpr("value", "headers").writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", ckpt).trigger(availableNow=True).start())
        return _run(q)

    assert run() == []            # startingOffsets defaults to latest for a new stream
    with Producer({"bootstrap.servers": spark_broker}) as p:
        p.send(topic, b"after", headers=[("trace", b"42")]).result(30)
    assert run() == [1]
    (row,) = spark.read.parquet(out).collect()
    assert row["value"] == b"after" and [(h["key"], h["value"]) for h in row["headers"]] == [
        ("trace", b"42")]


def test_pattern_stream_picks_up_a_new_topic_from_its_earliest(spark, spark_broker, make_topic,
                                                                produce, tmp_path):
    first = make_topic(1)
    prefix = first.rsplit("-", 1)[0]
    produce(first, [b"a"] * 7)
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")

    def run():
        q = (spark.readStream.format("oncelog").option("bootstrap.servers", spark_broker)
             .option("subscribePattern", f"{prefix}-[0-9]+").option("startingOffsets", "earliest")
             .load().selectExpr("topic", "offset").writeStream.format("parquet")
             .option("path", out).option("checkpointLocation", ckpt)
             .trigger(availableNow=True).start())
        return _run(q)

    assert sum(run()) == 7
    second = make_topic(2)
    assert second.rsplit("-", 1)[0] == prefix
    produce(second, [b"b"] * 5)
    assert sum(run()) == 5          # the new topic is read from its earliest offset
    rows = spark.read.parquet(out).collect()
    assert sorted((r["topic"], r["offset"]) for r in rows if r["topic"] == first) == [
        (first, o) for o in range(7)]
    assert sum(1 for r in rows if r["topic"] == second) == 5


def test_max_offsets_per_trigger_makes_the_expected_micro_batches(spark, spark_broker,
                                                                  make_topic, produce, tmp_path):
    topic = make_topic(2)
    produce(topic, [b"x"] * 600, partition=0)
    produce(topic, [b"y"] * 400, partition=1)
    q = (_stream(spark, spark_broker, topic, maxOffsetsPerTrigger="300")
         .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(availableNow=True).start())
    assert _run(q) == [300, 300, 300, 100]


def _sink_rows(spark, bootstrap, topic, isolation="read_committed"):
    return [r["value"] for r in read_topic(spark, bootstrap, topic, **{
        "kafka.isolation.level": isolation}).select("value").collect()]


def _pipe(spark, bootstrap, src, dst, ckpt, write_opts, **sink_options):
    w = (_stream(spark, bootstrap, src, maxOffsetsPerTrigger="150").select("key", "value")
         .writeStream.format("oncelog").options(**write_opts).option("topic", dst)
         .option("checkpointLocation", ckpt).trigger(availableNow=True))
    for k, v in sink_options.items():
        w = w.option(k, v)
    return w.start()


def test_failed_sink_commit_replayed_writes_nothing_twice(spark, spark_broker, make_topic,
                                                           produce, write_opts, tmp_path):
    src, dst = make_topic(2), make_topic(2)
    values = [f"v{i}".encode() for i in range(400)]
    produce(src, values)
    ckpt = str(tmp_path / "ckpt")
    q = _pipe(spark, spark_broker, src, dst, ckpt, write_opts, _failCommitBatch="1")
    with pytest.raises(Exception, match="injected sink commit failure for batch 1"):
        q.awaitTermination()
    # batch 1's tasks had produced before the commit failed; abort() aborted them
    assert len(_sink_rows(spark, spark_broker, dst, "read_uncommitted")) == 300
    assert len(_sink_rows(spark, spark_broker, dst)) == 150
    assert sorted(f for f in os.listdir(os.path.join(ckpt, "commits")) if f.isdigit()) == ["0"]

    q = _pipe(spark, spark_broker, src, dst, ckpt, write_opts)   # replays batch 1, then 2
    assert sum(_run(q)) == 250
    assert sorted(_sink_rows(spark, spark_broker, dst)) == sorted(values)


def test_batch_replayed_after_sink_commit_is_skipped(spark, spark_broker, make_topic, produce,
                                                      write_opts, tmp_path):
    """Spark crashed after our commit() recorded the batch but before its own commit log: the
    replayed batch id is found in the marker topic and nothing is written again."""
    src, dst = make_topic(1), make_topic(1)
    values = [f"w{i}".encode() for i in range(200)]
    produce(src, values)
    ckpt = str(tmp_path / "ckpt")
    assert sum(_run(_pipe(spark, spark_broker, src, dst, ckpt, write_opts))) == 200
    for name in ("1", ".1.crc"):
        os.remove(os.path.join(ckpt, "commits", name))
    assert sum(_run(_pipe(spark, spark_broker, src, dst, ckpt, write_opts))) == 50
    assert sorted(_sink_rows(spark, spark_broker, dst)) == sorted(values)


def test_sink_id_option_survives_a_new_checkpoint(spark, spark_broker, make_topic, produce,
                                                  write_opts, tmp_path):
    """With an explicit sinkId the markers follow the sink, not the query id."""
    src, dst = make_topic(1), make_topic(1)
    produce(src, [b"a"] * 10)
    sink = f"sink-{dst}"
    assert sum(_run(_pipe(spark, spark_broker, src, dst, str(tmp_path / "c1"), write_opts,
                          sinkId=sink))) == 10
    # a new checkpoint starts again at batch 0, which this sink id has already committed
    assert sum(_run(_pipe(spark, spark_broker, src, dst, str(tmp_path / "c2"), write_opts,
                          sinkId=sink))) == 10
    assert len(_sink_rows(spark, spark_broker, dst)) == 10


def test_local_2_fails_the_query_on_a_task_failure(spark, spark_broker, make_topic, produce,
                                                   write_opts, tmp_path):
    src, dst = make_topic(1), make_topic(1)
    produce(src, [b"z"] * 20)
    q = _pipe(spark, spark_broker, src, dst, str(tmp_path / "ckpt"), write_opts,
              _failWriteAttempt0="0")
    with pytest.raises(Exception, match="injected failure of task 0 attempt 0"):
        q.awaitTermination()


def test_retried_task_local_2_3_writes_once(spark_retry, spark_broker, make_topic, produce,
                                            write_opts, tmp_path):
    src, dst = make_topic(2), make_topic(2)
    values = [f"r{i}".encode() for i in range(300)]
    produce(src, values)
    q = _pipe(spark_retry, spark_broker, src, dst, str(tmp_path / "ckpt"), write_opts,
              _failWriteAttempt0="1")
    assert sum(_run(q)) == 300
    assert q.exception() is None
    assert sorted(_sink_rows(spark_retry, spark_broker, dst)) == sorted(values)
