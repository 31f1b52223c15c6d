"""Speculation forced: Spark never speculates in local mode (TaskSchedulerImpl), so this runs on
`local-cluster[2,1,1024]` (a master and two one-core executors, each its own JVM). The task of
source partition 1 is slow in its first attempt after it produced rows; Spark launches a copy on
the other executor, whose InitProducerId fences the original: the copy's transaction is the one
the driver commits, the original's rows are aborted. read_committed readers see each row once."""
import pytest
from test_exactly_once import _source, assert_exactly_once

from conftest import read_topic


@pytest.fixture
def spark_speculating(_spark_sessions):
    from oncelog.spark.session import local_session
    _spark_sessions.stop()
    session = local_session(
        "local-cluster[2,1,1024]", app="oncelog-tests-speculation",
        **{"spark.speculation": "true", "spark.speculation.interval": "200ms",
           "spark.speculation.quantile": "0.5", "spark.speculation.multiplier": "1.2",
           "spark.speculation.minTaskRuntime": "1s", "spark.executor.memory": "512m",
           "spark.sql.execution.arrow.maxRecordsPerBatch": "10"})
    _spark_sessions.current, _spark_sessions.master = session, "local-cluster"
    yield session
    _spark_sessions.stop()


def _slow_first_attempt(seconds: float):
    """value and partition; the first attempt of the task reading source partition 1 sleeps at
    offset 60 (rows before it have reached the writer)."""
    from pyspark.sql.functions import col, udf

    def pass_or_sleep(partition, offset, value):
        import time

        from pyspark import TaskContext
        if partition == 1 and offset == 60 and TaskContext.get().attemptNumber() == 0:
            time.sleep(seconds)
        return value

    return [udf(pass_or_sleep, "binary")(col("partition"), col("offset"), col("value"))
            .alias("value"), col("partition")]


def test_speculative_copy_fences_the_slow_original(spark_speculating, spark_broker, make_topic,
                                                   produce, write_opts):
    spark = spark_speculating
    src, dst = _source(produce, make_topic), make_topic(2)
    # warm-up: a Python worker on each executor, so that the fast task and the copy are fast
    # and the copy starts while the original sleeps (a fresh executor's first task takes ~20 s
    # on a loaded machine, and the copy waits for 1.2x the fast task's time)
    read_topic(spark, spark_broker, src).select(*_slow_first_attempt(0)).write.format("noop") \
        .mode("overwrite").save()
    (read_topic(spark, spark_broker, src).select(*_slow_first_attempt(90))
     .write.format("oncelog").options(**write_opts).option("topic", dst).mode("append").save())
    uncommitted = assert_exactly_once(spark, spark_broker, dst)
    # the slow original had produced rows before the copy fenced it (aborted, seen only by
    # read_uncommitted readers): otherwise speculation did not happen and this proves nothing
    assert any(n > 1 for n in uncommitted.values())
