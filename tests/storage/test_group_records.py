"""A group record log compacted off the event loop (`storage.group_records.RecordLog`, driven as
the broker's group commit drives it: `begin_sync` on the loop, `run_sync` on a thread, `end_sync`
on the loop): what was appended while the new file was written ends up in it, what a power cut
keeps of it is everything that was answered, and a compaction whose log changed meanwhile (or
that failed) leaves the old file as it was."""
from __future__ import annotations

import errno
import shutil

import pytest

from oncelog.storage import group_records
from oncelog.storage.group_records import ASIDE_SUFFIX, RecordLog

NOW = 1_700_000_000_000


@pytest.fixture(autouse=True)
def small_slack(monkeypatch):
    monkeypatch.setattr(group_records, "COMPACT_SLACK_BYTES", 0)


def _log(tmp_path, n: int = 4) -> RecordLog:
    """A log due for compaction: every key written three times."""
    log = RecordLog.create_empty(tmp_path / "g.offsets")
    for _round in range(3):
        log.append([(("offset", str(i)), {"v": _round, "pad": "x" * 500}) for i in range(n)], shared=False, sync=False)
    return log


def _values(path) -> dict:
    return RecordLog.load(path)[1]


def _synced_view(log: RecordLog, tmp_path) -> dict:
    """What a power cut right now keeps of the log (its file cut to what is known fsynced)."""
    copy = tmp_path / "power-cut.offsets"
    shutil.copyfile(log.path, copy)
    with open(copy, "r+b") as f:
        f.truncate(log.synced)
    return _values(copy)


def test_appends_made_while_the_compaction_ran_are_in_the_new_file(tmp_path):
    log = _log(tmp_path)
    token = log.begin_sync(NOW)
    assert token is not None and token[0] == "compact"
    log.run_sync(token)                                  # (a thread's work)
    log.append([(("offset", "0"), {"v": "later"})], shared=False, sync=False)
    log.append([(("offset", "1"), None)], shared=False, sync=False)    # a tombstone
    writes = log.writes
    log.end_sync(token, None, NOW)
    assert log.generation == 1 and log.size < log.writes
    assert log.durable_end_offset < writes               # the new name and the appends: not yet durable
    expected = {("offset", "0"): {"v": "later"}, **{("offset", str(i)): {"v": 2, "pad": "x" * 500} for i in (2, 3)}}
    assert _values(log.path) == expected
    token = log.begin_sync(NOW)                          # the fsync of the file and its directory
    assert token is not None and token[0] == "fsync" and token[4]
    log.run_sync(token)
    log.end_sync(token, None, NOW)
    assert log.durable_end_offset == writes and log.begin_sync(NOW) is None
    assert not list(tmp_path.glob("*" + ASIDE_SUFFIX))


def test_an_answered_sync_append_made_meanwhile_is_on_disk_before_the_new_file_replaces_the_old(tmp_path):
    """A marker's append (fsynced, answered) while the compaction ran: the new file must hold it
    durably before it is put in place, or a power cut after the rename loses it."""
    log = _log(tmp_path)
    token = log.begin_sync(NOW)
    assert token is not None
    log.run_sync(token)
    log.append([(("offset", "9"), {"v": "answered"})], shared=False, sync=True)
    assert log.durable_end_offset == log.writes
    log.end_sync(token, None, NOW)
    assert log.generation == 1
    assert _synced_view(log, tmp_path)[("offset", "9")] == {"v": "answered"}


def test_a_compaction_of_a_log_replaced_whole_or_dropped_meanwhile_is_not_installed(tmp_path):
    for change in ("write_whole", "close"):
        d = tmp_path / change
        d.mkdir()
        log = _log(d)
        token = log.begin_sync(NOW)
        assert token is not None
        log.run_sync(token)
        if change == "write_whole":
            log.write_whole(group_records.framed([(("offset", "new"), {"v": 1})]))
        else:
            log.closed = True
        before = log.path.read_bytes()
        log.end_sync(token, None, NOW)
        assert log.path.read_bytes() == before
        assert not list(d.glob("*" + ASIDE_SUFFIX))


def test_a_failed_compaction_leaves_the_old_file_and_waits_before_trying_again(tmp_path, monkeypatch):
    log = _log(tmp_path)
    before = log.path.read_bytes()
    token = log.begin_sync(NOW)
    assert token is not None and token[0] == "compact"

    def full(*_args, **_kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(group_records, "write_aside", full)
    with pytest.raises(OSError):
        log.run_sync(token)
    log.end_sync(token, OSError(errno.ENOSPC, "No space left on device"), NOW)
    assert log.path.read_bytes() == before and log.failed is None and log.sync_generation == 0
    token = log.begin_sync(NOW)                          # the appends are fsynced, not compacted again at once
    assert token is not None and token[0] == "fsync"


def test_the_appends_a_compaction_let_wait_get_their_fsync_before_another_compaction(tmp_path):
    """Appends during a compaction are answered after the fsync that follows it; were the log due
    again at once, another compaction first would make them wait again (under a steady stream of
    large commits, for ever)."""
    log = _log(tmp_path)
    token = log.begin_sync(NOW)
    assert token is not None and token[0] == "compact"
    log.run_sync(token)
    for i in range(20):   # far more than the live records: due again once installed
        log.append([(("offset", f"new-{i}"), {"pad": "y" * 500}), (("offset", f"new-{i}"), None)], shared=False,
                   sync=False)
    log.end_sync(token, None, NOW)
    assert log.due()
    token = log.begin_sync(NOW)
    assert token is not None and token[0] == "fsync"
    log.run_sync(token)
    log.end_sync(token, None, NOW)
    assert log.durable_end_offset == log.writes
    token = log.begin_sync(NOW)
    assert token is not None and token[0] == "compact"   # then it may compact again
