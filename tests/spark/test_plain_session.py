"""A plain SparkSession in a script run by the virtual environment's interpreter, not activated:
`python3` on PATH is another interpreter, without oncelog, and PYSPARK_PYTHON is unset. Spark
starts its Python workers with PYSPARK_PYTHON (default python3), so `format("oncelog")` was
DATA_SOURCE_NOT_FOUND; importing oncelog.spark before the session points the workers at the
driver's interpreter, and the README's read/write example runs as written."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from oncelog.client import AdminClient, Consumer, Producer
from oncelog.client.types import TopicPartition

pytestmark = [pytest.mark.processes, pytest.mark.spark]

SCRIPT = textwrap.dedent("""
    import sys
    import oncelog.spark  # before the session: Spark's Python workers then run this interpreter
    from pyspark.sql import SparkSession

    bootstrap, topic = sys.argv[1], sys.argv[2]
    spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    df = spark.read.format("oncelog").option("bootstrap.servers", bootstrap).option("subscribe", topic).load()
    print("READ", sorted(r.value.decode() for r in df.select("value").collect()))
    (df.selectExpr("key", "upper(cast(value as string)) as value")
       .write.format("oncelog").option("bootstrap.servers", bootstrap).option("topic", topic + "-out")
       .mode("append").save())
    spark.stop()
""")


def _another_python(tmp_path) -> str:
    """A directory whose `python3` is the base interpreter of this virtual environment (no oncelog)."""
    base = getattr(sys, "_base_executable", None) or shutil.which("python3", path="/usr/bin")
    probe = subprocess.run([base, "-c", "import oncelog"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip(f"{base} has oncelog installed: no interpreter without it to stand in for the system's")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(base)
    return str(bin_dir)


def test_a_plain_session_reads_and_writes_without_pyspark_python(broker, tmp_path):
    b, topic = broker.bootstrap, "plain-session"
    admin = AdminClient({"bootstrap.servers": b})
    try:
        admin.create_topics([topic])[topic].result()
    finally:
        admin.close()
    with Producer({"bootstrap.servers": b}) as p:
        for v in (b"a", b"b", b"c"):
            p.send(topic, v, key=v)
        p.flush(30)
    java = shutil.which("java")
    if java is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java: Spark cannot start")
    path = os.pathsep.join([_another_python(tmp_path), os.path.dirname(java or ""), "/usr/bin", "/bin"])
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV", "PYTHONPATH")}
    env.update({"PATH": path, "SPARK_LOCAL_IP": "127.0.0.1"})
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    r = subprocess.run([sys.executable, str(script), b, topic], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "READ ['a', 'b', 'c']" in r.stdout
    out = TopicPartition(f"{topic}-out", 0)
    c = Consumer({"auto.offset.reset": "earliest", "bootstrap.servers": b, "isolation.level": "read_committed"})
    try:
        c.assign([TopicPartition(out.topic, 0, 0)])
        end = c.end_offsets([out])[out]
        values: list[bytes] = []
        deadline = time.monotonic() + 60
        while (c.position(out) or 0) < end:
            assert time.monotonic() < deadline, values
            values += [r.value for r in c.poll(1.0)]
    finally:
        c.close()
    assert sorted(values) == [b"A", b"B", b"C"]
