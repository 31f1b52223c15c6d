"""Missing Java or pyarrow fail with a message that says what to install (no Spark started)."""
import subprocess
import sys

import pytest

from oncelog.spark.options import OncelogSparkError
from oncelog.spark.session import check_environment


def test_missing_java_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    with pytest.raises(OncelogSparkError, match=r"Spark needs Java 17 or 21.*JAVA_HOME=.*no-jdk"):
        check_environment()
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(OncelogSparkError, match="put `java` on PATH or set JAVA_HOME"):
        check_environment()


def test_missing_pyarrow_says_what_to_do():
    # a fresh interpreter where importing pyarrow fails, as on an executor without it
    code = ("import sys; sys.modules['pyarrow'] = None\n"
            "from oncelog.spark.arrow_io import require_pyarrow\n"
            "from oncelog.spark.options import OncelogSparkError\n"
            "try:\n    require_pyarrow()\nexcept OncelogSparkError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "needs pyarrow on the driver and every executor" in out.stdout, out.stderr
    assert "PYSPARK_PYTHON" in out.stdout


def test_python_workers_import_the_installed_compiled_pyspark(spark):
    """The Makefile (install-test and every test target) moves a pip-installed pyspark's
    python/lib/pyspark.zip aside: Spark puts it first on its workers' PYTHONPATH, and a worker
    importing pyspark from a zip compiles it at every start (2.2 CPU-s instead of 0.7; Spark
    gives a worker 10 s to connect back, and under CI's load streaming queries failed with
    'Python worker failed to connect back')."""
    import pyspark
    where = spark.range(1).rdd.map(lambda _: __import__("pyspark").__file__).collect()
    assert where == [pyspark.__file__], f"workers import {where}: run the tests with make (it moves the zip aside)"
