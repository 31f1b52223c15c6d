"""oncelog: a Kafka-wire-compatible streaming log for exactly-once producing."""
import sys as _sys

__version__ = "0.1.0"


def _import_kio_without_hypothesis() -> None:
    """kio registers Hypothesis strategies for its types whenever Hypothesis can be imported
    (kio.static._phantom: `try: import hypothesis.strategies`). Where Hypothesis is installed (a
    test or development environment) every process importing kio paid 0.36 CPU-s for hooks
    oncelog never uses: each broker, command and PySpark worker start. kio is imported here with
    Hypothesis made unimportable for that one import and importable again right after; a process
    that imported Hypothesis before (a test) keeps kio's hooks."""
    if "hypothesis" in _sys.modules or "kio" in _sys.modules:
        return
    _sys.modules["hypothesis"] = None  # type: ignore[assignment]   # ImportError, which kio catches
    try:
        import kio.static._phantom  # noqa: F401
    finally:
        del _sys.modules["hypothesis"]


_import_kio_without_hypothesis()
