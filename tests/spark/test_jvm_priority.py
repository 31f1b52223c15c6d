"""The tests' Spark JVM runs ahead of the test load where the tests may raise priority
(jvm_priority.py says why: Spark's hard-coded 10 s for a Python worker to connect back)."""
import os

import pytest
from jvm_priority import RAISE, raised


def test_the_jvm_and_its_python_workers_start_raised(spark):
    with raised() as permitted:
        pass
    if not permitted:
        pytest.skip("lowering niceness needs root (CI runs as root); the JVM runs at normal priority")
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    jvm = spark.sparkContext._gateway.proc.pid
    assert os.getpriority(os.PRIO_PROCESS, jvm) == ours - RAISE
    # the workers Spark starts inherit it: a Python UDF reports its own niceness
    seen = spark.range(1).rdd.map(lambda _: os.getpriority(os.PRIO_PROCESS, 0)).collect()
    assert seen == [ours - RAISE]
