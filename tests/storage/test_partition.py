"""Partition over a real PartitionLog in a temp directory: dedup, epochs, expiry, snapshots,
restart, the log-tail lookup and old message formats. Our versions of UnifiedLogTest's duplicate
and producer-state cases (kafka_broker.md §4) plus the issue's cases."""
from __future__ import annotations

import pytest

from oncelog.broker.metrics import producer_state_metrics
from oncelog.core.producer_state import ProducerStateConfig
from oncelog.core.sequence import MAX_SEQUENCE
from oncelog.protocol import records as rec
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.records import Record, encode_batch
from oncelog.storage import producer_snapshots as snaps
from oncelog.storage.log import LogConfig, PartitionLog
from oncelog.storage.partition import Partition, PartitionConfig

NOW = 1_700_000_000_000
PID = 4242


def batch(seq: int, n: int = 2, pid: int = PID, epoch: int = 0, tag: bytes = b"v") -> bytearray:
    records = [Record(i, NOW, None, tag + b"%d-%d" % (seq, i), []) for i in range(n)]
    return bytearray(encode_batch(records, producer_id=pid, producer_epoch=epoch, base_sequence=seq))


def plain(n: int = 1) -> bytearray:
    return bytearray(encode_batch([Record(i, NOW, None, b"p%d" % i, []) for i in range(n)]))


def crash_log(log) -> None:
    """Drop the log as a crashed process does: its files stay as written (the page cache outlives
    the process), nothing is flushed, no index is written and no clean-shutdown marker is left,
    so the next open recovers (CRC scan of the active segment, indexes rebuilt)."""
    for seg in log.segments:
        seg.close()


class Env:
    def __init__(self, directory, log_config=None, **producer_config):
        self.directory = directory
        self.log_config = log_config or LogConfig()
        self.producer_config = {k.replace("_", "."): v for k, v in producer_config.items()}
        self.partition = self.open()

    def open(self, now=NOW) -> Partition:
        log = PartitionLog.open(self.directory, self.log_config, now)
        return Partition("t", 0, log, ProducerStateConfig.from_topic_config(self.producer_config), now_ms=now)

    def restart(self, clean=True, now=NOW):
        if clean:
            self.partition.close()
        else:
            crash_log(self.partition.log)  # no producer snapshot, no clean-shutdown marker
        self.partition = self.open(now)
        return self.partition

    def append(self, records, now=NOW):
        return self.partition.append_from_client(records, now)

    @property
    def end(self):
        return self.partition.log_end_offset


@pytest.fixture
def env(tmp_path):
    return lambda log_config=None, **kw: Env(tmp_path / "t-0", log_config, **kw)


def fill(e: Env, batches: int, size: int = 2, pid: int = PID, epoch: int = 0, start: int = 0):
    out = []
    for i in range(batches):
        r = e.append(batch(start + i * size, size, pid, epoch))
        assert r.error_code == 0, r
        out.append(r.base_offset)
    return out


# -------------------------------------------------------------- UnifiedLogTest cases

def test_duplicate_appends(env):
    e = env()
    offsets = fill(e, 10)
    end = e.end
    r = e.append(batch(18))
    assert (r.error_code, r.base_offset) == (0, offsets[9])
    assert r.extra["duplicate"] == "latest"
    assert e.append(batch(17)).error_code == E.OUT_OF_ORDER_SEQUENCE_NUMBER  # partial duplicate
    r = e.append(batch(12))  # 4th from the tail
    assert (r.error_code, r.base_offset) == (0, offsets[6])
    r = e.append(batch(8))  # older than the 5 retained
    assert r.error_code == E.OUT_OF_ORDER_SEQUENCE_NUMBER and r.log_start_offset == 0
    assert e.end == end  # nothing appended by any of these
    assert e.partition.counters.duplicates_latest == 1 and e.partition.counters.duplicates_window == 1
    assert e.partition.counters.out_of_order == 2


def test_non_sequential_append_and_old_epoch(env):
    e = env()
    fill(e, 1, epoch=3)
    assert e.append(batch(5, epoch=3)).error_code == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    r = e.append(batch(2, epoch=2))
    assert r.error_code == E.INVALID_PRODUCER_EPOCH and r.error_message
    assert e.append(batch(2, epoch=4)).error_code == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert e.append(batch(0, epoch=4)).error_code == 0


def test_producer_state_survives_segment_deletion(env):
    e = env(LogConfig(segment_bytes=600))
    offsets = fill(e, 12)
    e.partition.delete_records_before(offsets[-1])
    assert e.partition.log_start_offset > offsets[5]
    r = e.append(batch(22))  # the latest batch: still a duplicate though its segment is gone
    assert (r.error_code, r.base_offset) == (0, offsets[-1])
    assert e.append(batch(24)).error_code == 0  # and the producer continues in sequence


def test_periodic_producer_expiration(env):
    e = env(producer_id_expiration_ms=60_000)
    fill(e, 3)
    e.partition.tick(NOW + 30_000)
    assert e.partition.producers_tracked == 1
    e.partition.tick(NOW + 30_000 + 599_999)  # the next check is not due yet
    assert e.partition.producers_tracked == 1
    e.partition.tick(NOW + 30_000 + 600_000)
    assert e.partition.producers_tracked == 0 and e.partition.counters.expirations == 1
    # its batches are still in the log: it is restored from the tail and simply continues,
    # rather than meeting UNKNOWN_PRODUCER_ID below its last acknowledged offset (a false alarm
    # of data loss for its client)
    r = e.append(batch(6), now=NOW + 11 * 60_000)
    assert (r.error_code, r.base_offset) == (0, 6)
    assert e.partition.counters.restored == 1 and e.partition.producers_tracked == 1


def test_expired_producer_restored_from_the_tail_answers_its_duplicates(env):
    e = env(producer_id_expiration_ms=1000)
    offsets = fill(e, 3)
    e.partition.remove_expired_producers(NOW + 5000)
    r = e.append(batch(4), now=NOW + 5000)  # a retry of the last batch, after expiry
    assert (r.error_code, r.base_offset) == (0, offsets[-1]) and e.end == offsets[-1] + 2


def test_retry_at_sequence_0_after_expiry_is_a_duplicate_not_a_second_append(env):
    # librdkafka after an epoch bump writes at sequence 0; the answer is lost; the producer
    # idles past expiry (the partition was unavailable) and then retries the same batch.
    e = env(producer_id_expiration_ms=1000)
    first = e.append(batch(0, 3, epoch=1), now=NOW).base_offset
    e.partition.remove_expired_producers(NOW + 5000)
    end = e.end
    r = e.append(batch(0, 3, epoch=1), now=NOW + 5000)
    assert (r.error_code, r.base_offset, e.end) == (0, first, end)
    assert e.partition.counters.restored == 1


def test_a_new_producer_costs_no_log_lookup(env):
    e = env(producer_id_expiration_ms=1000)
    fill(e, 3)
    e.partition.remove_expired_producers(NOW + 5000)
    assert e.append(batch(0, pid=999), now=NOW + 5000).error_code == 0
    assert e.partition.counters.restored == 0 and PID in e.partition.producer_state.expired


def test_expired_producers_are_forgotten_once_the_log_start_passes_them(env):
    e = env(LogConfig(segment_bytes=600), producer_id_expiration_ms=1000)
    fill(e, 3)
    e.partition.remove_expired_producers(NOW + 5000)
    assert PID in e.partition.producer_state.expired
    e.partition.delete_records_before(e.end)
    assert PID not in e.partition.producer_state.expired


def test_lookup_reach_0_still_restores_the_newest_batch_through_the_index(env):
    e = env(producer_id_expiration_ms=1000, producer_state_expired_lookup_offsets=0)
    offsets = fill(e, 3)
    e.partition.remove_expired_producers(NOW + 5000)
    r = e.append(batch(6), now=NOW + 5000)
    assert (r.error_code, r.base_offset) == (0, offsets[-1] + 2)
    assert [b[2] for b in e.partition.producer_state.entry(PID).batches] == [offsets[-1], offsets[-1] + 2]


# -------------------------------------------------------------- issue 13, items 2 and 3

class CountingReads:
    """Counts the batch headers the partition reads from its (real) log."""

    def __init__(self, log):
        self.log, self.headers = log, 0
        for name in ("iter_batches_from", "batch_headers_between"):
            real = getattr(log, name)
            setattr(log, name, self._counted(real))

    def _counted(self, real):
        def read(*args):
            for h in real(*args):
                self.headers += 1
                yield h
        return read


def test_idle_producer_beyond_the_lookup_reach_continues_without_false_data_loss(env):
    # The case: offsets 0..5 from producer 1, 60 other records, expiry, then seq 6..7.
    # A scan of the last 50 offsets misses its batches; the remembered offsets do not.
    e = env(producer_id_expiration_ms=1000, producer_state_expired_lookup_offsets=50)
    offsets = fill(e, 3, pid=1)
    assert offsets == [0, 2, 4]
    for _ in range(60):
        assert e.append(plain()).error_code == 0
    e.partition.remove_expired_producers(NOW + 5000)
    r = e.append(batch(6, pid=1), now=NOW + 5000)
    assert (r.error_code, r.base_offset) == (0, 66), r
    r = e.append(batch(2, pid=1), now=NOW + 5000)  # and its window is whole: an older retry is a duplicate
    assert (r.error_code, r.base_offset) == (0, 2)


@pytest.mark.parametrize("clean", [True, False], ids=["clean-restart", "crash"])
def test_expired_producers_are_remembered_across_a_restart(env, clean):
    # Before: the remembered set lived in memory only, and after a restart a seq-0 retry of a
    # producer that expired before it was appended a second time.
    e = env(producer_id_expiration_ms=1000)
    first = e.append(batch(0, 3, epoch=1), now=NOW).base_offset
    fill(e, 2, pid=77)
    e.partition.remove_expired_producers(NOW + 5000)
    assert PID in e.partition.producer_state.expired
    e.restart(clean=clean, now=NOW + 6000)
    assert PID in e.partition.producer_state.expired
    end = e.end
    r = e.append(batch(0, 3, epoch=1), now=NOW + 6000)
    assert (r.error_code, r.base_offset, e.end) == (0, first, end)


def test_a_restored_producer_keeps_its_window_through_a_crash(env):
    # A restore writes no snapshot (that would cost the whole state per request); a crash after
    # the producer appended again must still give back its whole window, by replay.
    e = env(producer_id_expiration_ms=1000)
    offsets = fill(e, 3)
    e.partition.remove_expired_producers(NOW + 5000)
    assert e.append(batch(6), now=NOW + 5000).base_offset == offsets[-1] + 2
    e.restart(clean=False, now=NOW + 6000)
    r = e.append(batch(0), now=NOW + 6000)  # the oldest batch of its window, retried
    assert (r.error_code, r.base_offset) == (0, offsets[0])
    assert [b[2] for b in e.partition.producer_state.entry(PID).batches] == offsets + [offsets[-1] + 2]


def test_a_never_seen_producer_at_a_non_zero_sequence_reads_nothing_from_the_log(env):
    e = env()
    fill(e, 200, pid=5)
    reads = CountingReads(e.partition.log)
    for pid in range(1000, 1100):
        r = e.append(batch(1, pid=pid))
        assert r.error_code == E.UNKNOWN_PRODUCER_ID and r.log_start_offset == 0
    assert reads.headers == 0
    assert e.partition.counters.unknown_producer == 100


def test_restoring_an_expired_producer_reads_its_own_batches_not_the_tail(env):
    e = env(producer_id_expiration_ms=1000)
    offsets = fill(e, 3, pid=1)
    for _i in range(2000):
        assert e.append(plain()).error_code == 0
    e.partition.remove_expired_producers(NOW + 5000)
    reads = CountingReads(e.partition.log)
    r = e.append(batch(4, pid=1), now=NOW + 5000)  # a retry of its last batch
    assert (r.error_code, r.base_offset) == (0, offsets[-1])
    assert reads.headers <= 10, reads.headers  # the 3 batches and what the index reaches past
    assert e.append(batch(6, pid=1), now=NOW + 5000).error_code == 0
    assert e.append(batch(1, pid=2), now=NOW + 5000).error_code == E.UNKNOWN_PRODUCER_ID
    assert reads.headers <= 10  # neither the live producer nor a stranger reads again


def test_producer_cap_evicts_the_least_recently_updated_and_keeps_its_deduplication(env):
    e = env(producer_state_max_producers_per_partition=3, producer_id_expiration_ms=60_000)
    for i, pid in enumerate((1, 2, 3)):
        assert e.append(batch(0, pid=pid), now=NOW + i).error_code == 0
    r = e.append(batch(0, pid=4), now=NOW + 10)  # a new producer at the cap: appended, not refused
    assert (r.error_code, r.base_offset) == (0, 6)
    state = e.partition.producer_state
    assert len(state) == 3 and 1 not in state and 1 in state.expired  # the least recently updated
    assert state.evictions == 1
    # the evicted producer's retry is still a duplicate (restored from the log, evicting another),
    # and it continues in sequence
    end = e.end
    r = e.append(batch(0, pid=1), now=NOW + 20)
    assert (r.error_code, r.base_offset, e.end) == (0, 0, end)
    assert e.append(batch(2, pid=1), now=NOW + 20).base_offset == end
    assert 2 in state.expired and len(state) == 3
    for pid, first in ((2, 0), (3, 0), (4, 0)):  # and so does every producer, evicted or not
        assert e.append(batch(first, pid=pid), now=NOW + 30).base_offset == (pid - 1) * 2
    assert e.append(batch(1, pid=5)).error_code == E.UNKNOWN_PRODUCER_ID  # never seen: as before
    metrics = producer_state_metrics([e.partition])
    assert metrics["oncelog_producer_state_producers_evicted_total"] == [({"topic": "t"}, state.evictions)]


def test_an_evicted_producer_keeps_its_whole_window_through_a_crash(env):
    e = env(producer_state_max_producers_per_partition=1, producer_state_batches_to_retain=6)
    offsets = fill(e, 6, pid=1)
    assert e.append(batch(0, pid=2), now=NOW + 1).error_code == 0  # evicts producer 1
    e.restart(clean=False, now=NOW + 2)
    for i in range(6):  # every batch of its window, retried, is answered with its offset
        r = e.append(batch(2 * i, pid=1), now=NOW + 3)
        assert (r.error_code, r.base_offset) == (0, offsets[i]), i


def test_restoring_reads_each_remembered_batch_header_not_the_log_between(env, monkeypatch):
    # A slow producer among many small batches of others: each of its batches is found through
    # the offset index and read by at most an index interval, however much lies in between.
    e = env(producer_id_expiration_ms=1000)
    offsets = []
    for i in range(5):
        offsets += fill(e, 1, pid=1, start=2 * i)
        for _ in range(1500):
            assert e.append(plain()).error_code == 0
    e.partition.remove_expired_producers(NOW + 5000)
    reads = PreadBytes(monkeypatch)
    r = e.append(batch(0, pid=1), now=NOW + 5000)  # the oldest batch of its window, retried
    assert (r.error_code, r.base_offset) == (0, offsets[0])
    interval = e.log_config.index_interval_bytes
    # per batch: the header at its index entry, then at most an interval of others' small batches
    assert reads.calls <= 2 * 5 and reads.total <= 5 * (interval + 2 * rec.BATCH_OVERHEAD), reads.total
    assert e.partition.log.size_bytes > 20 * reads.total


class PreadBytes:
    """Bytes and calls of os.pread by the log (how it reads its segment files)."""

    def __init__(self, monkeypatch):
        import oncelog.storage.log as storage_log
        self.total = self.calls = 0
        real = storage_log.os.pread

        def counting(fd, n, pos):
            data = real(fd, n, pos)
            self.total += len(data)
            self.calls += 1
            return data
        monkeypatch.setattr(storage_log.os, "pread", counting)


def test_batch_header_at_finds_batches_and_only_batches(env):
    from oncelog.protocol.records import encode_legacy_message
    e = env(LogConfig(segment_bytes=1000, index_interval_bytes=300))
    offsets = fill(e, 40, pid=9)
    log_ = e.partition.log
    assert len(log_.segments) > 2
    for o in offsets:
        h = log_.batch_header_at(o)
        assert (h.base_offset, h.producer_id, h.base_sequence) == (o, 9, o)
    assert log_.batch_header_at(offsets[3] + 1) is None     # inside a batch: no batch starts there
    assert log_.batch_header_at(e.end) is None
    legacy = e.partition.log.append(bytearray(encode_legacy_message(0, None, b"old")), NOW).first_offset
    assert log_.batch_header_at(legacy) is None
    e.partition.delete_records_before(offsets[10] + 1)      # the log start cuts batch 10
    assert log_.batch_header_at(offsets[9]) is None
    assert log_.batch_header_at(offsets[10]).base_offset == offsets[10]  # its last offset is still there


# -------------------------------------------------------------- forgotten for room: the watermark

def _churn(e, waves: int, now: int, first_pid: int = 1000) -> int:
    """Short-lived producers, one batch each, expiring in waves (a Spark sink opening a
    producer per task per micro-batch)."""
    for wave in range(waves):
        for pid in range(first_pid + 10 * wave, first_pid + 10 * wave + 10):
            assert e.append(batch(0, 1, pid=pid), now=now).error_code == 0
        now += 5000
        e.partition.remove_expired_producers(now)
    return now


def test_a_producer_forgotten_for_room_is_told_its_state_is_lost_not_its_data(env):
    e = env(producer_id_expiration_ms=1000, producer_state_max_remembered_producers_per_partition=10)
    offsets = fill(e, 3, pid=1)              # last acknowledged offset 5
    now = _churn(e, 3, NOW)
    state = e.partition.producer_state
    assert 1 not in state and 1 not in state.expired and state.expired.forgotten > 0
    r = e.append(batch(6, pid=1), now=now)
    # UNKNOWN_PRODUCER_ID with a log start above its last acknowledged offset: its client resets
    # (as after retention) instead of raising DataLossError; the log itself still starts at 0
    assert r.error_code == E.UNKNOWN_PRODUCER_ID and r.log_start_offset > offsets[-1] + 1
    assert e.partition.log_start_offset == 0
    assert r.log_start_offset == state.state_start <= e.end
    r = e.append(batch(0, pid=1, epoch=1), now=now)  # the reset: a new epoch from sequence 0
    assert (r.error_code, r.base_offset) == (0, e.end - 2)
    # a producer still remembered is restored as before, whatever the watermark
    last = max(state.expired.items(), key=lambda item: item[1].end)[0]
    assert e.append(batch(1, 1, pid=last), now=now).error_code == 0


def test_a_forgotten_producers_retry_at_sequence_0_is_accepted_afresh(env):
    # What the watermark cannot do: a producer forgotten for room whose retry is its first batch
    # (sequence 0) looks like a new producer and is appended again, as after Kafka's expiry.
    e = env(producer_id_expiration_ms=1000, producer_state_max_remembered_producers_per_partition=0)
    first = e.append(batch(0, pid=1)).base_offset
    e.partition.remove_expired_producers(NOW + 5000)
    r = e.append(batch(0, pid=1), now=NOW + 5000)
    assert r.error_code == 0 and r.base_offset != first


@pytest.mark.parametrize("clean", [True, False], ids=["clean-restart", "crash"])
def test_the_producer_state_start_survives_a_restart(env, clean):
    e = env(producer_id_expiration_ms=1000, producer_state_max_remembered_producers_per_partition=0)
    fill(e, 3, pid=1)
    e.partition.remove_expired_producers(NOW + 5000)
    start = e.partition.producer_state.state_start
    assert start == 6
    assert e.append(batch(0, pid=2), now=NOW + 5000).error_code == 0  # the log moves on
    e.restart(clean=clean, now=NOW + 5000)
    assert e.partition.producer_state.state_start == start
    r = e.append(batch(6, pid=1), now=NOW + 5000)
    assert (r.error_code, r.log_start_offset) == (E.UNKNOWN_PRODUCER_ID, 6)


def test_unknown_producer_after_deletion_and_expiry_carries_log_start(env):
    e = env(LogConfig(segment_bytes=600), producer_id_expiration_ms=1000)
    fill(e, 10)
    e.partition.delete_records_before(e.end)
    e.partition.remove_expired_producers(NOW + 5000)
    r = e.append(batch(20), now=NOW + 5000)
    assert r.error_code == E.UNKNOWN_PRODUCER_ID and r.log_start_offset == e.partition.log_start_offset > 0


# -------------------------------------------------------------- the cases

def test_duplicate_15_back_on_window_20_answers_original_offset_and_timestamp(env):
    e = env(producer_state_batches_to_retain=20)
    offsets = fill(e, 30)
    first = e.partition.log.read(offsets[14], 1)
    end = e.end
    r = e.append(batch(14 * 2))
    assert (r.error_code, r.base_offset) == (0, offsets[14])
    assert r.extra == {"producer_state_batches_to_retain": 20, "max_in_flight_sequence_number": None,
                       "duplicate": "window"}
    assert e.end == end and e.partition.log.read(offsets[14], 1) == first


def test_duplicate_15_back_on_window_5_is_refused_and_appends_nothing(env):
    e = env(producer_state_batches_to_retain=5)
    fill(e, 30)
    end = e.end
    r = e.append(batch(14 * 2))
    assert r.error_code == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert r.extra["producer_state_batches_to_retain"] == 5
    assert e.end == end


def _log_with_batches(directory, batches, log_config=None):
    """Write batches straight into a log (as replication or an old broker would), then close it."""
    cfg = log_config or LogConfig()
    log = PartitionLog.open(directory, cfg, NOW)
    for b in batches:
        log.append(b, NOW)
    log.close()


def test_range_mode_duplicate_sequence_within_range_out_of_order_beyond_across_wrap(tmp_path):
    # The producer is near the wrap: its history comes from the log (replayed without validation).
    directory = tmp_path / "t-0"
    _log_with_batches(directory, [batch(MAX_SEQUENCE - 99, 50), batch(MAX_SEQUENCE - 49, 71)])  # .. 20
    e = Env(directory, producer_state_dedup_mode="range", max_in_flight_sequence_number_per_connection=100)
    p = e.partition
    assert p.max_in_flight_sequence_number == 100
    end = e.end
    r = e.append(batch(MAX_SEQUENCE - 49, 71))  # the latest: offset known
    assert (r.error_code, r.base_offset) == (0, 50)
    for first, n in ((MAX_SEQUENCE - 60, 5), (MAX_SEQUENCE - 10, 5), (0, 21), (MAX_SEQUENCE - 78, 1)):
        r = e.append(batch(first, n))
        assert r.error_code == E.DUPLICATE_SEQUENCE_NUMBER, (first, n, r)
        assert r.extra["max_in_flight_sequence_number"] == 100
    assert e.append(batch(MAX_SEQUENCE - 79, 1)).error_code == E.OUT_OF_ORDER_SEQUENCE_NUMBER  # 100 below
    assert e.append(batch(MAX_SEQUENCE - 99, 50)).error_code == E.OUT_OF_ORDER_SEQUENCE_NUMBER  # 120 below
    assert e.append(batch(15, 10)).error_code == E.OUT_OF_ORDER_SEQUENCE_NUMBER  # straddles the latest
    assert e.append(batch(22, 1)).error_code == E.OUT_OF_ORDER_SEQUENCE_NUMBER  # gap
    assert e.end == end
    assert e.append(batch(21, 3)).error_code == 0
    assert p.counters.duplicates_sequence == 4 and p.counters.duplicates_latest == 1


def test_full_window_still_deduplicates_after_restart(env):
    e = env(producer_state_batches_to_retain=20)
    offsets = fill(e, 25)
    e.restart(clean=True)
    assert list(snaps.list_snapshots(e.directory))
    end = e.end
    for i in range(5, 25):
        r = e.append(batch(i * 2))
        assert (r.error_code, r.base_offset) == (0, offsets[i]), i
    assert e.append(batch(4 * 2)).error_code == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert e.end == end
    assert e.append(batch(50)).error_code == 0


def test_full_window_after_crash_rebuilds_from_snapshot_and_log(env):
    e = env(LogConfig(segment_bytes=1500), producer_state_batches_to_retain=20)
    offsets = fill(e, 40)
    assert snaps.list_snapshots(e.directory), "segment rolls write snapshots"
    e.restart(clean=False)
    for i in range(20, 40):
        r = e.append(batch(i * 2))
        assert (r.error_code, r.base_offset) == (0, offsets[i]), i


def test_corrupt_snapshot_is_set_aside_and_state_rebuilt(env, caplog):
    e = env(LogConfig(segment_bytes=1500), producer_state_batches_to_retain=20)
    offsets = fill(e, 40)
    e.partition.close()
    newest = snaps.list_snapshots(e.directory)[-1][1]
    data = bytearray(newest.read_bytes())
    newest.write_bytes(bytes(data[: len(data) - 7]))  # truncated
    with caplog.at_level("WARNING"):
        p = e.open()
    e.partition = p
    assert "set aside" in caplog.text
    assert newest.with_name(newest.name + ".corrupt").exists()
    assert p.counters.snapshots_set_aside == 1
    for i in range(20, 40):
        r = e.append(batch(i * 2))
        assert (r.error_code, r.base_offset) == (0, offsets[i]), i


def test_all_snapshots_corrupt_rebuilds_from_whole_log(env):
    e = env(LogConfig(segment_bytes=1500))
    offsets = fill(e, 20)
    e.partition.close()
    for _off, path in snaps.list_snapshots(e.directory):
        path.write_bytes(b"garbage")
    e.partition = e.open()
    r = e.append(batch(38))
    assert (r.error_code, r.base_offset) == (0, offsets[-1])


def test_window_change_at_runtime(env):
    e = env()
    offsets = fill(e, 30)
    assert e.append(batch(14 * 2)).error_code == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    e.partition.update_config(PartitionConfig(e.log_config, ProducerStateConfig(batches_to_retain=20)))
    assert e.partition.producer_state_batches_to_retain == 20
    offsets += fill(e, 20, start=60)
    r = e.append(batch(60 + 2))  # 19 batches back
    assert (r.error_code, r.base_offset) == (0, offsets[31])
    assert e.append(batch(0)).error_code == E.OUT_OF_ORDER_SEQUENCE_NUMBER  # far below the window
    e.partition.update_config(PartitionConfig(e.log_config, ProducerStateConfig(batches_to_retain=5)))
    assert e.append(batch(60 + 2)).error_code == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    r = e.append(batch(60 + 15 * 2))
    assert (r.error_code, r.base_offset) == (0, offsets[45])


# -------------------------------------------------------------- older duplicates: the tail lookup

def test_tail_lookup_finds_the_original_offset(env):
    e = env(producer_state_duplicate_lookup_offsets=10_000)
    offsets = []
    for i in range(30):
        offsets.append(e.append(batch(i * 2)).base_offset)
        e.append(plain(3))
        e.append(batch(i, 1, pid=PID + 1))
    end = e.end
    r = e.append(batch(3 * 2))
    assert (r.error_code, r.base_offset) == (0, offsets[3]) and r.extra["duplicate"] == "tail"
    assert e.append(batch(3 * 2 + 1)).error_code == E.OUT_OF_ORDER_SEQUENCE_NUMBER  # no exact batch
    assert e.end == end


def test_tail_lookup_is_bounded(env):
    e = env(producer_state_duplicate_lookup_offsets=20)
    for i in range(30):
        e.append(batch(i * 2))
    assert e.append(batch(22 * 2)).error_code == 0  # 2 below the window: within 20 offsets
    assert e.append(batch(3 * 2)).error_code == E.OUT_OF_ORDER_SEQUENCE_NUMBER  # too far back


def test_tail_lookup_never_answers_another_epoch(env):
    e = env(producer_state_dedup_mode="range", producer_state_duplicate_lookup_offsets=10_000)
    fill(e, 5, epoch=0)           # epoch 0 sequences 0..9
    new = fill(e, 5, epoch=1)     # epoch 1 sequences 0..9 again, later offsets
    r = e.append(batch(2, epoch=1))
    assert (r.error_code, r.base_offset) == (0, new[1])
    assert e.append(batch(2, epoch=0)).error_code == E.INVALID_PRODUCER_EPOCH


def test_range_mode_tail_lookup_answers_offsets(env):
    e = env(producer_state_dedup_mode="range", producer_state_duplicate_lookup_offsets=1000)
    offsets = fill(e, 10)
    r = e.append(batch(4))
    assert (r.error_code, r.base_offset) == (0, offsets[2])
    r = e.append(batch(5, 2))  # within range but not a batch boundary: no offset known
    assert r.error_code == E.DUPLICATE_SEQUENCE_NUMBER


def test_tail_lookup_respects_log_start(env):
    e = env(LogConfig(segment_bytes=600), producer_state_duplicate_lookup_offsets=10_000)
    fill(e, 20)
    e.partition.delete_records_before(30)
    start = e.partition.log_start_offset
    r = e.append(batch(0))
    assert r.error_code == E.OUT_OF_ORDER_SEQUENCE_NUMBER and r.log_start_offset == start


# -------------------------------------------------------------- formats and bad input

def test_idempotent_produce_to_old_format_is_refused(env):
    e = env(LogConfig(message_format_version="0.10.2"))
    r = e.append(batch(0))
    assert r.error_code == E.UNSUPPORTED_FOR_MESSAGE_FORMAT and "v1" in r.error_message
    assert e.end == 0 and r.log_start_offset == 0
    assert e.partition.counters.unsupported_format == 1
    assert e.append(plain(2)).error_code == 0  # non-idempotent writes still work


def test_bad_idempotent_record_sets(env):
    e = env()
    two = batch(0) + batch(2)
    assert e.append(two).error_code == E.INVALID_RECORD
    b = batch(0)
    b[-1] ^= 1
    r = e.append(b)
    assert r.error_code == E.CORRUPT_MESSAGE and r.log_start_offset == 0
    assert e.end == 0
    assert e.partition.producers_tracked == 0
    assert e.append(batch(0)).error_code == 0


def test_plain_batches_bypass_producer_state(env):
    e = env()
    r1 = e.append(plain(3))
    r2 = e.append(plain(3))
    assert (r1.base_offset, r2.base_offset) == (0, 3)
    assert r1.extra["producer_state_batches_to_retain"] == 5
    assert e.partition.producers_tracked == 0


def test_state_gauges(env):
    e = env()
    for pid in range(100):
        e.append(batch(0, 1, pid=pid))
    assert e.partition.producers_tracked == 100
    assert 0 < e.partition.producer_state_bytes < 100 * 400
    e.partition.log.flush()  # reads stop at the fsynced end (the broker's group commit moves it)
    assert isinstance(next(iter(rec.iter_batches(e.partition.read(0, 1 << 20))))[1], rec.BatchHeader)


def test_truncation_rebuilds_producer_state(env):
    e = env(LogConfig(segment_bytes=600))
    offsets = fill(e, 12)
    e.partition.truncate_to(offsets[6], now_ms=NOW)
    assert e.end == offsets[6]
    assert e.append(batch(6 * 2 + 2)).error_code == E.OUT_OF_ORDER_SEQUENCE_NUMBER  # batch 7 is gone
    r = e.append(batch(5 * 2))
    assert (r.error_code, r.base_offset) == (0, offsets[5])  # still the latest
    r = e.append(batch(6 * 2))
    assert (r.error_code, r.base_offset) == (0, offsets[6])  # appended again


def test_producer_state_metrics_per_topic(env):
    from oncelog.broker.metrics import PRODUCER_STATE_METRICS
    e = env()
    fill(e, 3)
    e.append(batch(4))
    e.append(batch(40))
    m = producer_state_metrics([e.partition])
    assert set(m) == {name for name, *_ in PRODUCER_STATE_METRICS}
    assert m["oncelog_producer_state_producers"] == [({"topic": "t"}, 1)]
    assert ({"topic": "t", "kind": "latest"}, 1) in m["oncelog_producer_state_duplicates_total"]
    assert m["oncelog_producer_state_out_of_order_total"] == [({"topic": "t"}, 1)]
    assert m["oncelog_producer_state_bytes"][0][1] > 0


def test_replay_skips_legacy_messages_between_batches(env):
    from oncelog.protocol.records import encode_legacy_message
    from oncelog.storage.partition import _v2_headers
    b1 = encode_batch([Record(0, NOW, None, b"a", [])], producer_id=5, producer_epoch=0, base_sequence=0)
    legacy = encode_legacy_message(1, None, b"xyz") + encode_legacy_message(2, b"k", b"xyzw", magic=0)
    b2 = encode_batch([Record(i, NOW, None, b"b", []) for i in range(2)], producer_id=5, producer_epoch=0,
                      base_sequence=1, base_offset=3)
    assert [h.base_sequence for h in _v2_headers(b1 + legacy + b2)] == [0, 1]
    assert [h.base_sequence for h in _v2_headers(legacy + b2 + b"\0\0\0")] == [1]


def test_storage_error_commits_nothing(env, monkeypatch):
    import errno
    e = env()
    fill(e, 2)
    real_append = e.partition.log.append

    def full_disk(buf, now_ms):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(e.partition.log, "append", full_disk)
    r = e.append(batch(4))
    assert r.error_code == E.KAFKA_STORAGE_ERROR and r.log_start_offset == 0
    monkeypatch.setattr(e.partition.log, "append", real_append)
    r = e.append(batch(4))
    assert (r.error_code, r.base_offset) == (0, 4)
    assert r.extra.get("duplicate") is None  # judged afresh, appended once


def test_take_snapshot_and_skip_if_offset_unchanged(env):
    e = env()
    fill(e, 3)
    p = e.partition
    path = p.take_snapshot()
    assert path is not None and path.name == f"{e.end:020d}.pstate"
    assert p.take_snapshot() is None  # Kafka's testSkipSnapshotIfOffsetUnchanged
    fill(e, 1, start=6)
    assert p.take_snapshot() is not None
    assert [o for o, _ in snaps.list_snapshots(e.directory)] == [6, 8]


def test_snapshots_beyond_the_log_end_are_removed_on_open(env):
    e = env()
    offsets = fill(e, 6)
    e.partition.take_snapshot()
    e.partition.truncate_to(offsets[3], now_ms=NOW)  # as if recovery cut the tail
    assert [o for o, _ in snaps.list_snapshots(e.directory) if o > e.end] == []
    r = e.append(batch(4))  # batch 2 is the latest again
    assert (r.error_code, r.base_offset, r.extra["duplicate"]) == (0, offsets[2], "latest")
    r = e.append(batch(6))  # batch 3 was cut: appended anew at the same offset
    assert (r.error_code, r.base_offset) == (0, offsets[3]) and "duplicate" not in r.extra


def test_million_style_many_producers_survive_restart(env):
    e = env(producer_state_batches_to_retain=5)
    for pid in range(2000):
        assert e.append(batch(0, 1, pid=pid)).error_code == 0
    e.restart(clean=True)
    assert e.partition.producers_tracked == 2000
    assert e.append(batch(0, 1, pid=1234)).extra["duplicate"] == "latest"


def test_a_recompressed_batch_keeps_its_producer_state_and_a_retry_is_a_duplicate(env):
    """compression.type=zstd: an uncompressed idempotent batch is stored under zstd with its
    producer id, epoch and sequence, so the same batch sent again is a duplicate (same offset,
    nothing appended) and the next sequence follows it; a restart rebuilds the same state."""
    from dataclasses import replace
    e = env(replace(LogConfig(), compression_type="zstd"))
    first = e.append(batch(0, 3))
    assert (first.error_code, first.base_offset) == (0, 0)
    again = e.append(batch(0, 3))
    assert (again.error_code, again.base_offset, e.end) == (0, 0, 3)
    assert e.append(batch(3, 2)).error_code == 0
    data = bytes(e.partition.log.read(0, 1 << 20, e.end, True))  # unflushed: read to the log end
    headers = [h for _pos, h in rec.iter_batches(data)]
    assert [(h.compression, h.producer_id, h.base_sequence, h.records_count) for h in headers] == \
        [(4, PID, 0, 3), (4, PID, 3, 2)]
    assert [r.value for r in rec.decode_records(data)] == [b"v0-0", b"v0-1", b"v0-2", b"v3-0", b"v3-1"]
    e.restart(clean=False)
    assert e.append(batch(3, 2)).base_offset == 3  # a duplicate of the recompressed batch after recovery
