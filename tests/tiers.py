"""The two tiers of the suite (tests/conftest.py): `make test` runs the CI tier, `make test-all`
sets ONCELOG_TEST_TIER=all. A test written at its full size asks here for its size in this tier."""
import os

TIER = os.environ.get("ONCELOG_TEST_TIER", "ci")
FULL = TIER == "all"


def examples(full: int) -> int:
    """Hypothesis examples: all of them in the full tier, a third (at least 10) in CI."""
    return full if FULL else max(10, full // 3)


def size(ci, full):
    """A workload's size (records, seconds, scenarios) in this tier."""
    return full if FULL else ci
