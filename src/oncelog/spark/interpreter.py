"""Which Python Spark's workers run. Spark starts them with `PYSPARK_PYTHON` (default `python3`,
which outside an activated virtual environment is an interpreter without oncelog: the data
source is then not found, DATA_SOURCE_NOT_FOUND, or its workers crash). Spark reads the variable
from the environment its JVM started with, so it must be set before the session starts.

Importing `oncelog.spark` sets it to the importing interpreter when it is unset; an explicit
value always wins (a cluster whose executors have their own interpreter sets it). A session
already started without it cannot be fixed from here: a warning says so and what to do."""
from __future__ import annotations

import os
import sys
import warnings


def use_this_interpreter() -> None:
    if os.environ.get("PYSPARK_PYTHON"):
        return
    os.environ["PYSPARK_PYTHON"] = sys.executable
    if _session_started():
        warnings.warn(
            "a Spark session started before oncelog.spark was imported, with PYSPARK_PYTHON unset: its Python "
            "workers run `python3`, which may lack oncelog (DATA_SOURCE_NOT_FOUND). Import oncelog.spark before "
            f"creating the session, or set PYSPARK_PYTHON={sys.executable}", RuntimeWarning, stacklevel=3)


def _session_started() -> bool:
    if "pyspark" not in sys.modules:
        return False
    from pyspark import SparkContext
    return SparkContext._gateway is not None
