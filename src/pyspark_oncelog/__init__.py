"""Spark finds Python data sources by scanning for top-level `pyspark_*` modules that export
`DefaultSource` (pyspark/sql/worker/lookup_data_sources.py), so installing oncelog is enough for
`spark.read.format("oncelog")`.

Spark's lookup imports every such module without catching errors, so an import failure here
would break every Python data source of the session: on an unsupported pyspark the module
exports nothing and says why on stderr."""
import sys

try:
    from oncelog.spark.source import OncelogDataSource as DefaultSource
except ImportError as e:  # pragma: no cover - only on pyspark < 4.2 or without pyspark
    sys.stderr.write(f"oncelog: the Spark format 'oncelog' is not available ({e}); it needs "
                     "pyspark[sql] 4.2 or newer: pip install 'oncelog[spark]'\n")
else:
    __all__ = ["DefaultSource"]
