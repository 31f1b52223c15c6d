"""Start Spark's JVM ahead of the test load when the tests may.

Spark gives each Python worker it starts a hard-coded 10 s to connect back
(`PythonWorkerFactory.createSimpleWorker`), and a streaming source starts a fresh worker for every
query (`PythonStreamingSourceRunner`), which imports pyspark before connecting: 0.7 CPU-s. On
CI's 2-core machine, with four test workers, their brokers and librdkafka's suite running beside
it, that worker sometimes got under 7% of a core and the query failed with "Python worker failed
to connect back" (five of fifteen full runs): a failure of the machine's load, not of oncelog.

A process inherits the niceness of the thread that forked it, and the JVM's workers inherit the
JVM's; so the JVM is started from a thread raised by `RAISE` and everything Spark starts runs
ahead of the brokers and clients of other tests. Lowering niceness needs root (CI runs as root);
elsewhere the JVM starts at the normal priority."""
from __future__ import annotations

import contextlib
import os

RAISE = 5


@contextlib.contextmanager
def raised():
    """Run the body with this thread's niceness lowered by RAISE when permitted (Linux applies
    setpriority(PRIO_PROCESS, 0) to the calling thread only, so other threads are untouched)."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, before - RAISE)
    except PermissionError:
        yield False
        return
    try:
        yield True
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)
