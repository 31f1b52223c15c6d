"""PySpark connector: format "oncelog" (batch and streaming, read and write).

`oncelog.spark.OncelogDataSource` is imported lazily so that `oncelog.spark.options` and
`oncelog.spark.plan` work without pyspark."""


def __getattr__(name):
    if name == "OncelogDataSource":
        from oncelog.spark.source import OncelogDataSource
        return OncelogDataSource
    raise AttributeError(name)


__all__ = ["OncelogDataSource"]
