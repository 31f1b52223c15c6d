"""A local SparkSession set up for the connector, with clear errors when Java or pyarrow is
missing (Spark's own are "Java gateway process exited" and a crashed Python worker)."""
from __future__ import annotations

import os
import shutil
import sys

from oncelog.spark.options import OncelogSparkError


def check_environment() -> None:
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise OncelogSparkError(
            "Spark needs Java 17 or 21: install a JDK (e.g. apt-get install openjdk-17-jre-headless) "
            "and put `java` on PATH or set JAVA_HOME"
            + (f" (JAVA_HOME={java_home} has no bin/java)" if java_home else ""))
    try:
        import pyspark
        major, minor = (int(x) for x in pyspark.__version__.split(".")[:2])
    except ImportError:
        raise OncelogSparkError("pyspark is not installed: pip install 'oncelog[spark]'") from None
    if (major, minor) < (4, 2):
        raise OncelogSparkError(f"the oncelog connector needs pyspark 4.2 or newer (admission "
                                f"control for Python streaming sources); found {pyspark.__version__}")
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise OncelogSparkError("the oncelog connector needs pyarrow: pip install 'oncelog[spark]'"
                                ) from None


def local_session(master: str = "local[2]", app: str = "oncelog", **conf):
    """`local[2]`, or `local[2,3]` so that failed tasks are retried (plain local[N] never retries)."""
    check_environment()
    # executors' Python workers must be this interpreter (the one with pyarrow and oncelog)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    b = (SparkSession.builder.master(master).appName(app)
         .config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.driver.memory", "1g")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.python.worker.reuse", "true"))
    for k, v in conf.items():
        b = b.config(k.replace("_", "."), v) if "." not in k else b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        import pyspark_oncelog  # noqa: F401 - Spark registers it by itself (pyspark_* lookup)
    except ImportError:
        from oncelog.spark.source import OncelogDataSource
        spark.dataSource.register(OncelogDataSource)
    return spark
