"""PySpark connector: format "oncelog" (batch and streaming, read and write).

`oncelog.spark.OncelogDataSource` is imported lazily so that `oncelog.spark.options` and
`oncelog.spark.plan` work without pyspark. Importing the package points Spark's Python workers at
this interpreter when PYSPARK_PYTHON is unset (`interpreter.py`): import it before the session
starts."""
from oncelog.spark.interpreter import use_this_interpreter

use_this_interpreter()


def __getattr__(name):
    if name == "OncelogDataSource":
        from oncelog.spark.source import OncelogDataSource
        return OncelogDataSource
    raise AttributeError(name)


__all__ = ["OncelogDataSource"]
