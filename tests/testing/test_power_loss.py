"""The power-loss harness: files cut to their last fsynced size, from the failpoint ledger."""
import pytest

from oncelog.protocol.records import Record, encode_batch
from oncelog.storage import failpoints as fp
from oncelog.storage.log import LogConfig, PartitionLog
from oncelog.testing.power_loss import LEDGER, NoLedgerError, lose_unsynced

NOW = 1_700_000_000_000


def batch(n=2):
    return encode_batch([Record(i, NOW, None, b"v%d" % i, []) for i in range(n)])


@pytest.fixture(autouse=True)
def _off_afterwards():
    yield
    fp.configure(None)


def test_segments_are_cut_to_what_an_fsync_covered(tmp_path):
    fp.configure(LEDGER)
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), NOW)
    log.append(batch(), NOW)
    log.flush(NOW)
    synced = log.segments[-1].size
    log.append(batch(), NOW)                   # page cache only
    cuts = lose_unsynced(tmp_path)
    assert [(c.path.name, c.kept, c.lost) for c in cuts] == [
        ("00000000000000000000.log", synced, log.segments[-1].size - synced)]
    for seg in log.segments:
        seg.close()
    again = PartitionLog.open(tmp_path / "t-0", LogConfig(), NOW)
    assert again.log_end_offset == 2


def test_a_directory_without_a_ledger_is_refused(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), NOW)
    log.append(batch(), NOW)
    with pytest.raises(NoLedgerError):
        lose_unsynced(tmp_path)
