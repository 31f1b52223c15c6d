"""`oncelog verify --workload share` at CI size: oncelog's and librdkafka's share consumers
(accepting, releasing and rejecting, killed -9 holding records) read a topic whose partitions and
share group move between two brokers and whose brokers are paused past their sessions. No record
lost, acknowledged twice, redelivered after its acknowledgement or delivered past its limit. The
same run against the broker before 2b523b5 (a broker that got a share group back served its stale
share-partitions from memory) reported hundreds of acknowledged-twice records
(docs/reliability.md, "The share workload"). The full tier runs every fault."""
import pytest
from tests.tiers import FULL, size

from oncelog.testing.faults import ALL_FAULTS
from oncelog.testing.verify import VerifyOptions, render, run

# one fault matrix at a time (tests/conftest.py)
pytestmark = [pytest.mark.processes, pytest.mark.xdist_group("faults")]


@pytest.mark.timeout(600)
def test_share_groups_under_pauses_and_moves(tmp_path):
    faults = (*ALL_FAULTS, "pause") if FULL else ("pause", "move")
    result = run(VerifyOptions(workload="share", faults=tuple(dict.fromkeys(faults)), records=size(800, 3000),
                               seed=3, clients=("oncelog", "librdkafka"), workdir=tmp_path))
    text = render(result)
    assert result.ok, text
    report = result.report
    assert report.records == size(800, 3000) and report.deliveries >= report.records, text
    fired = {e.fault for e in result.faults}
    assert {"pause", "move"} <= fired, text
    assert any("past" in e.what for e in result.faults if e.fault == "pause"), text


@pytest.mark.timeout(600)
def test_share_groups_with_a_dead_letter_topic_under_kills_and_power_loss(tmp_path):
    """--share-dlq (KIP-1191): the mixed members' rejected records and the poison records archived
    at the delivery limit each end in the group's dead-letter topic exactly once, while brokers
    are killed -9 (and, in the full tier, every fault runs), across the writes around them."""
    faults = (*ALL_FAULTS, "pause") if FULL else ("kill", "power-loss")
    result = run(VerifyOptions(workload="share", share_dlq=True, faults=tuple(dict.fromkeys(faults)),
                               records=size(600, 3000), seed=5, clients=("oncelog", "librdkafka"), workdir=tmp_path))
    text = render(result)
    assert result.ok, text
    figures = result.report.figures
    assert figures["dead-lettered: rejected"] > 0 and figures["dead-lettered: at the delivery limit"] > 0, text
    assert {"kill", "power-loss"} <= {e.fault for e in result.faults}, text
    assert not [n for n in result.notes if "dead letters" in n], text
