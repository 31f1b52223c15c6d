"""Spark finds Python data sources by scanning for top-level `pyspark_*` modules that export
`DefaultSource` (pyspark/sql/worker/lookup_data_sources.py), so installing oncelog is enough for
`spark.read.format("oncelog")`."""
from oncelog.spark.source import OncelogDataSource as DefaultSource

__all__ = ["DefaultSource"]
