"""Write tasks that fail after they produced rows (issue 14, item 11), on local[2,3] where Spark
retries them: every input event reaches the output, duplicates come only from failed attempts.

The failure is a Python UDF upstream of the sink raising in the middle of a task. Spark then ends
the Python writer's input without an error (the JVM drops the worker's socket, pyarrow reads the
end of file as the end of the stream), so the sink's write() returns for an attempt that Spark
failed: the sink must not take that for success. The failed attempt's writer produces its rows then,
racing the retry that fences it; a run where the retry won is run again (failing_udf.py)."""
from collections import Counter

import pytest
from failing_udf import failing_udf, until_the_failed_attempt_produced

from conftest import read_topic

ROWS = 200           # per source partition
STEP = 100           # maxOffsetsPerTrigger 200 over 2 partitions: ranges [0,100), [100,200)
FAIL_AT = 60         # the UDF raises at offset % STEP == FAIL_AT of source partition 1
PAD = b"." * 2000


@pytest.fixture
def small_arrow_batches(spark_retry):
    spark_retry.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")
    yield spark_retry
    spark_retry.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")


def _failing(attempts):
    """[value, partition]: value through a Python UDF that raises in the given attempts of a task
    reading source partition 1 when it reaches offset % STEP == FAIL_AT, written to the partition
    it was read from."""
    return failing_udf(attempts, fail_partition=1, step=STEP, fail_at=FAIL_AT)


def _source(produce, make_topic):
    src = make_topic(2)
    for p in (0, 1):
        produce(src, [f"{p}:{i}:".encode() + PAD for i in range(ROWS)], partition=p)
    return src


def _check(spark, bootstrap, dst, may_repeat):
    """Every source event in dst; an event written more than once must be one that a failed
    attempt had produced (`may_repeat(partition, offset)`). Returns the repeated events."""
    counts = Counter(r["id"] for r in read_topic(spark, bootstrap, dst).selectExpr(
        "substring_index(CAST(value AS STRING), ':', 2) AS id").collect())
    missing = [f"{p}:{i}" for p in (0, 1) for i in range(ROWS) if f"{p}:{i}" not in counts]
    assert not missing, f"{len(missing)} events lost, e.g. {missing[:5]}"
    assert len(counts) == 2 * ROWS
    repeated = [tuple(map(int, v.split(":"))) for v, n in counts.items() if n > 1]
    assert all(may_repeat(p, off) for p, off in repeated), sorted(repeated)
    return repeated


def _before_failure(p, off):
    return p == 1 and off % STEP < FAIL_AT


def test_streaming_task_failing_after_it_produced_loses_nothing(
        small_arrow_batches, spark_broker, make_topic, produce, write_opts, tmp_path):
    spark = small_arrow_batches
    runs = iter(range(10))

    def scenario() -> bool:
        src, dst = _source(produce, make_topic), make_topic(2)
        q = (spark.readStream.format("oncelog").option("bootstrap.servers", spark_broker)
             .option("subscribe", src).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", str(2 * STEP)).load()
             .select(_failing(attempts={0})).writeStream.format("oncelog").options(**write_opts)
             .option("topic", dst).option("checkpointLocation", str(tmp_path / f"ckpt{next(runs)}"))
             .trigger(availableNow=True).start())
        q.awaitTermination()
        assert q.exception() is None
        assert [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]] == [200, 200]
        # the failed attempts had produced rows before they failed (else this proves nothing)
        return bool(_check(spark, spark_broker, dst, _before_failure))
    until_the_failed_attempt_produced(scenario)


def test_batch_task_failing_after_it_produced_loses_nothing(
        small_arrow_batches, spark_broker, make_topic, produce, write_opts):
    spark = small_arrow_batches

    def scenario() -> bool:
        src, dst = _source(produce, make_topic), make_topic(2)
        (read_topic(spark, spark_broker, src).select(_failing(attempts={0}))
         .write.format("oncelog").options(**write_opts).option("topic", dst).mode("append").save())
        return bool(_check(spark, spark_broker, dst, lambda p, off: p == 1 and off < FAIL_AT))
    until_the_failed_attempt_produced(scenario)


def test_failed_query_restarted_writes_the_failed_task_again(
        small_arrow_batches, spark_broker, make_topic, produce, write_opts, tmp_path):
    """Every attempt of a task fails after producing, so the query fails (the driver's abort
    marks the tasks that finished); the restart replays the batch and must write that task in
    full, not take the rows its failed attempts produced for the whole."""
    spark = small_arrow_batches
    src, dst = _source(produce, make_topic), make_topic(2)
    ckpt = str(tmp_path / "ckpt")

    def start(attempts):
        return (spark.readStream.format("oncelog").option("bootstrap.servers", spark_broker)
                .option("subscribe", src).option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", str(2 * STEP)).load()
                .select(_failing(attempts)).writeStream.format("oncelog")
                .options(**write_opts).option("topic", dst).option("checkpointLocation", ckpt)
                .trigger(availableNow=True).start())

    q = start(attempts={0, 1, 2})          # local[2,3]: three attempts, all fail
    with pytest.raises(Exception, match="injected UDF failure"):
        q.awaitTermination()
    q = start(attempts=set())
    q.awaitTermination()
    assert q.exception() is None
    # batch 0's task for partition 0 may have been cut short when the stage was aborted, so
    # repeats are allowed in the whole of batch 0
    _check(spark, spark_broker, dst, lambda p, off: off < STEP)
