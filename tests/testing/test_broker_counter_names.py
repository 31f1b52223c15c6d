"""The verify harnesses read broker counters by their Prometheus names. Issue 39 renamed the `api`
labels to Kafka's names (`produce` became `Produce`), and the harnesses' lookups under the old
names read 0: one assertion failed for the wrong reason and two that a counter is 0 passed
vacuously. A name the broker does not label is now refused where it is looked up."""
import pytest

from oncelog.testing import txn_verify, verify
from oncelog.testing.fault_run import _check_api_label


@pytest.mark.parametrize("module", [verify, txn_verify], ids=["verify", "txn_verify"])
def test_every_counter_a_harness_reads_names_an_api_the_broker_labels(module):
    for key in module._BROKER_COUNTERS:
        _check_api_label(key)


@pytest.mark.parametrize("key", ["oncelog_requests_total{api=write_txn_markers}",
                                 "oncelog_request_errors_total{api=produce,error=INVALID_TXN_STATE}"])
def test_a_label_under_the_old_names_is_refused(key):
    with pytest.raises(ValueError, match="labels no API"):
        _check_api_label(key)
