"""Storage faults after the bytes reached a segment: a failed fsync, a failed cut, a failed roll.
Issue 13 item 1: nothing partial stays visible, a retry is appended once, producer state never
disagrees with the log, and a partition that cannot be cut back goes offline until a restart."""
from __future__ import annotations

import os

import pytest

from oncelog.core.producer_state import ProducerStateConfig
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.errors import KafkaProtocolError
from oncelog.protocol.records import Record, decode_records, encode_batch
from oncelog.storage import failpoints as fp
from oncelog.storage.log import LogConfig, PartitionLog
from oncelog.storage.partition import Partition

NOW = 1_700_000_000_000
PID = 7


def batch(seq: int, n: int = 3, pid: int = PID, epoch: int = 0) -> bytearray:
    records = [Record(i, NOW, None, b"s%d" % (seq + i), []) for i in range(n)]
    return bytearray(encode_batch(records, producer_id=pid, producer_epoch=epoch, base_sequence=seq))


def open_partition(directory, **cfg) -> Partition:
    config = LogConfig(**cfg)
    return Partition("t", 0, PartitionLog.open(directory, config, NOW), ProducerStateConfig(), now_ms=NOW)


def read_values(p: Partition) -> list[tuple[int, bytes]]:
    return [(r.offset, r.value) for r in decode_records(p.log.read(0, 1 << 20))]


@pytest.fixture
def failpoints():
    """The test hook of storage.failpoints; every failpoint is off again after the test."""
    yield fp.configure
    fp.configure(None)


def test_failed_fsync_leaves_nothing_and_the_retry_is_appended_once(tmp_path, failpoints):
    p = open_partition(tmp_path / "t-0", flush_messages=1)
    assert p.append_from_client(batch(0), NOW).base_offset == 0
    [rule] = failpoints("fsync-eio:log")
    r = p.append_from_client(batch(3), NOW)      # pwrite succeeds, fsync raises EIO
    assert rule.fired == 1
    assert r.error_code == E.KAFKA_STORAGE_ERROR
    assert p.log_end_offset == 3 and p.high_watermark == 3
    assert read_values(p) == [(0, b"s0"), (1, b"s1"), (2, b"s2")]   # the failed batch is not visible
    assert os.path.getsize(p.log.segments[-1].path) == p.log.segments[-1].size
    r = p.append_from_client(batch(3), NOW)      # the client's retry
    assert (r.error_code, r.base_offset, r.extra.get("duplicate")) == (0, 3, None)
    assert [o for o, _ in read_values(p)] == [0, 1, 2, 3, 4, 5]
    assert [v for _, v in read_values(p)] == [b"s%d" % i for i in range(6)]
    r = p.append_from_client(batch(3), NOW)      # and a second retry is a duplicate of it
    assert (r.error_code, r.base_offset, r.extra.get("duplicate")) == (0, 3, "latest")
    p.log.close()                                # a crash: no snapshot
    p = open_partition(tmp_path / "t-0", flush_messages=1)
    assert [o for o, _ in read_values(p)] == [0, 1, 2, 3, 4, 5]
    r = p.append_from_client(batch(3), NOW)
    assert (r.error_code, r.base_offset) == (0, 3)
    assert p.append_from_client(batch(6), NOW).base_offset == 6


def test_producer_state_forgets_every_batch_the_cut_removed(tmp_path, failpoints):
    """flush.messages=3: two batches wait above the last fsync; the fsync at the third fails and
    cuts all three. The state must forget them too, or the retries would be 'duplicates' of
    records the log no longer holds."""
    p = open_partition(tmp_path / "t-0", flush_messages=4)
    assert p.append_from_client(batch(0, 1), NOW).base_offset == 0
    assert p.append_from_client(batch(1, 1), NOW).base_offset == 1
    assert p.log.durable_end_offset == 0
    failpoints("fsync-eio:log")
    r = p.append_from_client(batch(2, 2), NOW)   # 4 unflushed: the fsync runs and fails
    assert r.error_code == E.KAFKA_STORAGE_ERROR
    assert p.log_end_offset == 0 and read_values(p) == []
    for seq, n, offset in ((0, 1, 0), (1, 1, 1), (2, 2, 2)):
        r = p.append_from_client(batch(seq, n), NOW)
        assert (r.error_code, r.base_offset, r.extra.get("duplicate")) == (0, offset, None)
    assert [v for _, v in read_values(p)] == [b"s0", b"s1", b"s2", b"s3"]


def test_a_cut_that_fails_takes_the_partition_offline_until_a_restart(tmp_path, failpoints):
    p = open_partition(tmp_path / "t-0", flush_messages=1)
    p.append_from_client(batch(0), NOW)
    failpoints("fsync-eio:log,truncate-eio:log")
    r = p.append_from_client(batch(3), NOW)
    assert r.error_code == E.KAFKA_STORAGE_ERROR
    assert p.log.offline
    failpoints(None)
    r = p.append_from_client(batch(3), NOW)      # offline: refused, nothing appended
    assert r.error_code == E.KAFKA_STORAGE_ERROR and "offline" in r.error_message
    with pytest.raises(KafkaProtocolError) as exc:
        p.read(0, 1 << 20)
    assert exc.value.code == E.KAFKA_STORAGE_ERROR
    p.close()                                    # no clean-shutdown marker: the next open recovers
    assert not (tmp_path / "t-0" / ".clean-shutdown").exists()
    p = open_partition(tmp_path / "t-0", flush_messages=1)
    assert not p.log.offline
    # the bytes the cut could not remove are whole: recovery keeps them, and producer state says so
    assert [o for o, _ in read_values(p)] == [0, 1, 2, 3, 4, 5]
    r = p.append_from_client(batch(3), NOW)
    assert (r.error_code, r.base_offset, r.extra.get("duplicate")) == (0, 3, "latest")


def test_write_caching_topic_goes_offline_rather_than_take_back_shown_records(tmp_path, failpoints):
    """With write.caching=true records above the last fsync were acknowledged and shown: a failed
    flush (flush.ms, not the append in progress) cannot cut them."""
    p = open_partition(tmp_path / "t-0", write_caching=True, flush_ms=1000)
    p.append_from_client(batch(0), NOW)
    failpoints("fsync-eio:log")
    with pytest.raises(KafkaProtocolError):
        p.maybe_flush(NOW + 5000)
    assert p.log.offline
    assert p.log_end_offset == 3


def test_write_caching_with_flush_messages_1_cuts_only_the_append_in_progress(tmp_path, failpoints):
    p = open_partition(tmp_path / "t-0", write_caching=True, flush_messages=1)
    p.append_from_client(batch(0), NOW)
    failpoints("fsync-eio:log")
    assert p.append_from_client(batch(3), NOW).error_code == E.KAFKA_STORAGE_ERROR
    assert not p.log.offline and p.log_end_offset == 3
    assert p.append_from_client(batch(3), NOW).base_offset == 3


def test_a_failed_fsync_at_a_roll_cuts_the_unsynced_tail(tmp_path, failpoints):
    p = open_partition(tmp_path / "t-0", segment_bytes=2 * len(batch(0)) + 10)
    p.append_from_client(batch(0), NOW)
    p.log.flush(NOW)
    p.append_from_client(batch(3), NOW)          # page cache only
    assert p.log.durable_end_offset == 3
    failpoints("fsync-eio:log")
    r = p.append_from_client(batch(6), NOW)      # needs a roll: its fsync fails
    assert r.error_code == E.KAFKA_STORAGE_ERROR
    assert len(p.log.segments) == 1 and p.log_end_offset == 3
    assert p.append_from_client(batch(3), NOW).base_offset == 3
    assert p.append_from_client(batch(6), NOW).base_offset == 6
    assert len(p.log.segments) == 2


def test_after_a_crash_recovery_fsyncs_what_it_keeps_before_anyone_reads_it(tmp_path, failpoints):
    """After kill -9 the tail may be only in the page cache: showing it and then losing it to a
    power cut would take back what consumers saw."""
    failpoints("ledger:log")
    p = open_partition(tmp_path / "t-0", write_caching=True)   # page-cache appends, no fsync
    p.append_from_client(batch(0), NOW)
    seg = p.log.segments[-1]
    assert fp.read_ledger(tmp_path / "t-0")[seg.path.name] == 0
    for s in p.log.segments:                                       # a crash: no close, no marker
        s.close()
    p = open_partition(tmp_path / "t-0")
    assert p.log.durable_end_offset == p.log_end_offset == 3
    assert fp.read_ledger(tmp_path / "t-0")[seg.path.name] == seg.size
