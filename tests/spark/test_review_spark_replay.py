"""Review of the driver-only streaming markers (i14-spark): a replayed micro-batch skips task *i*
because the driver's abort confirmed task *i* of the failed run, without checking that task *i*
of the replay holds the same rows. When the replay splits the batch differently, rows that no
attempt ever wrote are skipped and Spark reports the query healthy."""
import pytest
from test_task_failures import STEP, _check, _failing, _source


def test_review_replay_with_another_split_loses_no_rows(
        small_arrow_batches, spark_broker, make_topic, produce, write_opts, tmp_path):
    spark = small_arrow_batches
    src, dst = _source(produce, make_topic), make_topic(2)
    ckpt = str(tmp_path / "ckpt")

    def start(attempts, **source_options):
        reader = (spark.readStream.format("oncelog").option("bootstrap.servers", spark_broker)
                  .option("subscribe", src).option("startingOffsets", "earliest")
                  .option("maxOffsetsPerTrigger", str(2 * STEP)))
        for k, v in source_options.items():
            reader = reader.option(k, v)
        return (reader.load().select(_failing(attempts)).writeStream.format("oncelog")
                .options(**write_opts).option("topic", dst).option("checkpointLocation", ckpt)
                .trigger(availableNow=True).start())

    # Run 1: batch 0 in 4 tasks p0[0,50) p0[50,100) p1[0,50) p1[50,100); the last fails in
    # every attempt after producing 10 rows, the job fails, and the driver's abort confirms
    # the tasks that finished (0, 1 and usually 2).
    q = start({0, 1, 2}, minPartitions="4")
    with pytest.raises(Exception, match="injected UDF failure"):
        q.awaitTermination()
    # Run 2, the operator having dropped minPartitions: batch 0 is replayed in 2 tasks,
    # p0[0,100) and p1[0,100). Task 1 (all of p1) is "confirmed" by run 1's task 1 (p0[50,100))
    # and skipped: p1 offsets 60..99 were never written by anyone.
    q = start(set())
    q.awaitTermination()
    assert q.exception() is None
    _check(spark, spark_broker, dst, lambda p, off: off < STEP)


@pytest.fixture
def small_arrow_batches(spark_retry):
    spark_retry.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")
    yield spark_retry
    spark_retry.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
