"""The Python UDF the Spark failure tests put upstream of the sink, and the rule for tests that
need its failed attempt to have produced rows.

The UDF raises in chosen attempts of the task reading one source partition, at one offset of each
range of `step` offsets. Spark then ends the writer's input without an error, and the failed
attempt's writer hands its rows to the broker only then, while Spark already runs the retry,
whose writer opens the task's transaction and fences the failed attempt. On a loaded machine
the retry often wins: the failed attempt is fenced before any of its rows reached the broker
(exactly once holds; the case of aborted rows in the log is not exercised). Nothing in the UDF
can hold the retry back (its writer opens the transaction before it reads a row, and a UDF that
blocks holds its own rows too), so `until_the_failed_attempt_produced` runs such a scenario
again, with new topics, until the failed attempt's rows are in the log; every run is checked.

Everything the UDF runs is defined inside `failing_udf`: Spark's Python workers cannot import
the test modules, and cloudpickle copies nested functions by value."""
from __future__ import annotations

import pytest


def failing_udf(attempts, *, fail_partition: int, step: int, fail_at: int):
    """[value through the UDF, the source partition] (the sink writes each row to the partition
    its source partition names)."""
    from pyspark.sql.functions import col, udf

    def pass_or_fail(partition, offset, value):
        from pyspark import TaskContext
        attempt = TaskContext.get().attemptNumber()
        if partition == fail_partition and offset % step == fail_at and attempt in attempts:
            raise RuntimeError(f"injected UDF failure at offset {offset}, attempt {attempt}")
        return value

    return [udf(pass_or_fail, "binary")(col("partition"), col("offset"), col("value")).alias("value"),
            col("partition")]


def until_the_failed_attempt_produced(scenario, tries: int = 4) -> None:
    """scenario() runs and checks one write with a failing attempt and returns whether that
    attempt's rows reached the log; run until one did, at most `tries` times."""
    for _ in range(tries):
        if scenario():
            return
    pytest.fail(f"in {tries} runs the retry always fenced the failed attempt before its rows "
                "reached the log: the failure after producing was never exercised")
