"""Builds the class-data-sharing archive the tests' Spark JVMs start from (not collected by pytest):

    python tests/spark/class_archive.py build/spark-classes.jsa

A Spark driver JVM loads and verifies about 15,000 classes from Spark's jars at every start:
18 of its 28 CPU-seconds in a test driver's short life on this 2-core machine. A JVM started with
-XX:SharedArchiveFile maps those classes already parsed and verified from the archive (JDK 17's
dynamic AppCDS): measured 18.3 -> 8.6 CPU-s per driver JVM, 30 -> 20 s wall. The archive is
the classes one JVM loaded running what the tests run (a broker of its own; a streaming query
through the connector's source and exactly-once sink, then a batch read and write), dumped when
that JVM exits (-XX:ArchiveClassesAtExit).

The archive is written under another name and renamed once its JVM has exited: a JVM given a
truncated archive dies of SIGBUS, one given an archive of other jars or another JDK ignores it.
tests/conftest.py passes it to the tests' JVMs when it exists; the Makefile builds it beside lint."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from sessions import session_pids

ROWS = 50


def _job(bootstrap: str, checkpoint: str) -> None:
    """In the JVM being archived: what the tests' drivers and sessions do, small."""
    from pyspark.sql.functions import col

    from oncelog.spark.session import local_session
    spark = local_session("local[2]", app="oncelog-class-archive")
    opts = {"bootstrap.servers": bootstrap}
    (spark.readStream.format("oncelog").options(**opts).option("subscribe", "src")
     .option("startingOffsets", "earliest").load().select(col("value"), col("partition"))
     .writeStream.format("oncelog").options(**opts).option("topic", "dst")
     .option("checkpointLocation", checkpoint).trigger(availableNow=True).start().awaitTermination())
    df = spark.read.format("oncelog").options(**opts).option("subscribe", "dst").load()
    assert df.count() == 2 * ROWS, "the archive's job did not read back what it wrote"
    (df.select(col("value"), col("partition")).write.format("oncelog").options(**opts)
     .option("topic", "src").mode("append").save())
    spark.stop()


def build(target: str) -> None:
    from oncelog.client import AdminClient, Producer
    from oncelog.testing.embedded import BrokerProcess
    partial = target + ".partial"
    for stale in (target, partial):
        if os.path.exists(stale):
            os.remove(stale)
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(os.path.join(tmp, "data"), {}).start()
        try:
            with AdminClient({"bootstrap.servers": broker.bootstrap}) as admin:
                for topic in ("src", "dst"):
                    admin.create_topics([topic], num_partitions=2)[topic].result()
            with Producer({"bootstrap.servers": broker.bootstrap}) as p:
                for part in (0, 1):
                    for i in range(ROWS):
                        p.send("src", f"{part}:{i}".encode(), partition=part)
                p.flush()
            # the tests' JVM options (tests/conftest.py), and the archive's
            env = dict(os.environ, SPARK_SUBMIT_OPTS=" ".join(
                (os.environ.get("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"),
                 f"-XX:ArchiveClassesAtExit={partial}")))
            job = subprocess.Popen([sys.executable, __file__, "--job", broker.bootstrap,
                                    os.path.join(tmp, "ckpt")], env=env, start_new_session=True)
            if job.wait(600) != 0:
                raise SystemExit(f"the archive's Spark job failed (exit {job.returncode})")
            # the JVM outlives its Python driver while it writes the archive
            deadline = time.monotonic() + 300
            while session_pids(job.pid):
                if time.monotonic() > deadline:
                    raise SystemExit("the archiving JVM did not exit within 300 s")
                time.sleep(0.2)
        finally:
            broker.stop()
    if not os.path.exists(partial):
        raise SystemExit(f"the JVM wrote no archive at {partial}")
    os.replace(partial, target)


if __name__ == "__main__":
    if sys.argv[1] == "--job":
        _job(sys.argv[2], sys.argv[3])
    else:
        started = time.monotonic()
        build(os.path.abspath(sys.argv[1]))
        print(f"{sys.argv[1]}: {os.path.getsize(sys.argv[1]) / 1e6:.0f} MB in {time.monotonic() - started:.0f} s")
