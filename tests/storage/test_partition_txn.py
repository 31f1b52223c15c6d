"""The partition side of transactions over real files: open transactions tracked at append, the
LSO, markers (epoch and coordinator-epoch fencing), the `.txnindex` files, recovery after a crash
with an open transaction and after an abort, snapshots v4 with open transactions, truncation."""
from __future__ import annotations

import pytest

from oncelog.core.producer_state import ProducerStateConfig
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.errors import KafkaProtocolError
from oncelog.protocol.records import Record, encode_batch
from oncelog.storage import failpoints as fp
from oncelog.storage import producer_snapshots as snaps
from oncelog.storage.log import LogConfig, PartitionLog
from oncelog.storage.partition import Partition

NOW = 1_700_000_000_000
A, B = 1001, 2002


def txn_batch(pid: int, seq: int, n: int = 2, epoch: int = 0, transactional: bool = True) -> bytearray:
    records = [Record(i, NOW, None, b"%d-%d-%d" % (pid, seq, i), []) for i in range(n)]
    return bytearray(encode_batch(records, producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                                  transactional=transactional))


def crash(partition: Partition) -> None:
    """As a kill -9 leaves it: files as written, no snapshot, no clean-shutdown marker."""
    for seg in partition.log.segments:
        seg.close()


class Env:
    def __init__(self, directory, log_config=None):
        self.directory = directory
        self.log_config = log_config or LogConfig()
        self.p = self.open()

    def open(self) -> Partition:
        log = PartitionLog.open(self.directory, self.log_config, NOW)
        return Partition("t", 0, log, ProducerStateConfig(), now_ms=NOW)

    def append(self, batch) -> int:
        r = self.p.append_from_client(batch, NOW)
        assert r.error_code == 0, (r.error_code, r.error_message)
        self.p.log.flush()
        return r.base_offset

    def marker(self, pid, commit, epoch=0, coordinator_epoch=0) -> int:
        off = self.p.append_marker(pid, epoch, coordinator_epoch, commit, NOW)
        self.p.log.flush()
        return off

    def restart(self, clean: bool):
        if clean:
            self.p.close()
        else:
            crash(self.p)
        self.p = self.open()


def aborted(p: Partition, fetch=0, upper=None):
    upper = p.log_end_offset if upper is None else upper
    return [(t.producer_id, t.first_offset, t.last_offset) for t in p.aborted_transactions(fetch, upper).transactions]


def test_lso_is_the_open_transactions_first_offset_until_its_marker(tmp_path):
    env = Env(tmp_path)
    env.append(txn_batch(B, 0, transactional=False))           # 0-1 plain idempotent
    assert env.p.last_stable_offset == env.p.high_watermark == 2
    first = env.append(txn_batch(A, 0))                        # 2-3
    env.append(txn_batch(B, 2, transactional=False))           # 4-5
    assert env.p.high_watermark == 6 and env.p.last_stable_offset == first == 2
    env.append(txn_batch(A, 2))                                # 6-7: the same transaction
    assert env.p.last_stable_offset == 2
    off = env.marker(A, commit=True)
    assert off == 8 and env.p.last_stable_offset == env.p.high_watermark == 9
    assert aborted(env.p) == []


def test_abort_is_indexed_in_the_markers_segment_and_file(tmp_path):
    env = Env(tmp_path)
    env.append(txn_batch(A, 0))
    env.append(txn_batch(B, 0))
    off = env.marker(A, commit=False)
    assert env.p.last_stable_offset == 2  # B still open
    assert aborted(env.p) == [(A, 0, off)]
    seg = env.p.log.segments[-1]
    assert seg.txn_index_path.stat().st_size == 34
    env.marker(B, commit=True)
    assert env.p.last_stable_offset == env.p.high_watermark


def test_non_transactional_batch_inside_an_open_transaction_is_invalid_txn_state(tmp_path):
    env = Env(tmp_path)
    env.append(txn_batch(A, 0))
    r = env.p.append_from_client(txn_batch(A, 2, transactional=False), NOW)
    assert r.error_code == E.INVALID_TXN_STATE
    # a retry of the transactional batch is still a duplicate, not an error
    r = env.p.append_from_client(txn_batch(A, 0), NOW)
    assert r.error_code == 0 and r.base_offset == 0


def test_marker_epoch_and_coordinator_epoch_fencing(tmp_path):
    env = Env(tmp_path)
    env.append(txn_batch(A, 0, epoch=3))
    with pytest.raises(KafkaProtocolError) as e:
        env.p.append_marker(A, 2, 0, True, NOW)
    assert e.value.code == E.INVALID_PRODUCER_EPOCH
    env.marker(A, commit=True, epoch=3, coordinator_epoch=5)
    with pytest.raises(KafkaProtocolError) as e:
        env.p.append_marker(A, 3, 4, False, NOW)
    assert e.value.code == E.TRANSACTION_COORDINATOR_FENCED
    # a fence: a marker at a higher epoch aborts and moves the producer to it
    env.append(txn_batch(A, 2, epoch=3))
    env.marker(A, commit=False, epoch=4, coordinator_epoch=5)
    assert env.p.producer_state.entry(A).epoch == 4
    assert aborted(env.p) == [(A, 3, 5)]
    r = env.p.append_from_client(txn_batch(A, 4, epoch=3), NOW)
    assert r.error_code == E.INVALID_PRODUCER_EPOCH


def test_repeated_marker_closes_nothing(tmp_path):
    env = Env(tmp_path)
    env.append(txn_batch(A, 0))
    env.marker(A, commit=False)
    env.marker(A, commit=False)
    assert aborted(env.p) == [(A, 0, 2)]


@pytest.mark.parametrize("clean", [False, True])
def test_recovery_with_an_open_transaction(tmp_path, clean):
    env = Env(tmp_path)
    env.append(txn_batch(B, 0, transactional=False))
    env.append(txn_batch(A, 0))
    env.append(txn_batch(B, 2, transactional=False))
    env.restart(clean)
    assert env.p.txns.open_transactions() == [(A, 2)]
    assert env.p.last_stable_offset == 2
    off = env.marker(A, commit=True)
    assert env.p.last_stable_offset == off + 1


@pytest.mark.parametrize("clean", [False, True])
def test_recovery_rebuilds_the_txnindex(tmp_path, clean):
    env = Env(tmp_path)
    env.append(txn_batch(A, 0))
    env.append(txn_batch(B, 0))
    off = env.marker(A, commit=False)
    seg = env.p.log.segments[-1]
    if not clean:
        seg.txn_index_path.unlink()  # as if the write never reached the file
    env.restart(clean)
    assert aborted(env.p) == [(A, 0, off)]
    assert env.p.log.segments[-1].txn_index_path.stat().st_size == 34
    assert env.p.txns.open_transactions() == [(B, 2)]
    assert env.p.last_stable_offset == 2


def test_txnindex_across_segments_and_deleted_with_its_segment(tmp_path):
    env = Env(tmp_path, LogConfig(segment_bytes=300))
    env.append(txn_batch(A, 0))
    env.append(txn_batch(B, 0, transactional=False))
    env.append(txn_batch(B, 2, transactional=False))
    off = env.marker(A, commit=False)
    segs = env.p.log.segments
    assert len(segs) > 1
    holder = env.p.log.segment_holding(off)
    assert holder.txn_index_path.exists()
    assert aborted(env.p) == [(A, 0, off)]
    assert aborted(env.p, fetch=off + 1) == []
    env.restart(clean=False)
    assert aborted(env.p) == [(A, 0, off)]
    path = env.p.log.segment_holding(off).txn_index_path
    seq = 4
    while env.p.log.segments[-1].base_offset <= off:
        env.append(txn_batch(B, seq, transactional=False))
        seq += 2
    env.p.delete_records_before(env.p.log_end_offset)
    assert not path.exists()


def test_snapshot_v4_round_trip_with_open_transactions(tmp_path):
    env = Env(tmp_path)
    env.append(txn_batch(A, 0, epoch=2))
    env.marker(A, commit=True, epoch=2, coordinator_epoch=7)
    env.append(txn_batch(A, 2, epoch=2))
    env.append(txn_batch(B, 0))
    path = env.p.take_snapshot(force=True)
    _off, cols = snaps.read_snapshot(path)
    assert list(zip(cols.txn_pid, cols.txn_first)) == [(A, 3), (B, 5)]
    env.restart(clean=True)  # loads the snapshot, replays nothing
    assert env.p.txns.open_transactions() == [(A, 3), (B, 5)]
    assert env.p.producer_state.entry(A).coordinator_epoch == 7
    with pytest.raises(KafkaProtocolError) as e:
        env.p.append_marker(A, 2, 6, True, NOW)
    assert e.value.code == E.TRANSACTION_COORDINATOR_FENCED


def test_truncation_reopens_a_transaction_whose_marker_was_cut(tmp_path):
    env = Env(tmp_path)
    env.append(txn_batch(A, 0))
    off = env.marker(A, commit=False)
    env.p.truncate_to(off, NOW)
    assert aborted(env.p) == []
    assert env.p.txns.open_transactions() == [(A, 0)]
    assert not env.p.log.segments[-1].txn_index_path.exists()


def test_producer_with_open_transaction_never_expires(tmp_path):
    env = Env(tmp_path)
    env.append(txn_batch(A, 0))
    env.append(txn_batch(B, 0, transactional=False))
    assert env.p.remove_expired_producers(NOW + 10 * 86_400_000) == 1
    assert A in env.p.producer_state and B not in env.p.producer_state


def test_a_failed_fsync_at_recovery_opens_the_partition_offline_not_a_broken_broker(tmp_path):
    """A crash left markers to replay and recovery's fsync fails: opening used to raise from the
    replay's read of the offline log, and a broker that opens its partitions at start exited.
    The partition opens offline (every request KAFKA_STORAGE_ERROR) and the next open recovers it."""
    env = Env(tmp_path / "t-0")
    env.append(txn_batch(A, 0))
    env.marker(A, commit=True)
    crash(env.p)
    fp.configure("fsync-eio:log")
    try:
        p = env.open()
    finally:
        fp.configure(None)
    assert p.log.offline and "at recovery" in p.log.offline
    assert p.append_from_client(txn_batch(B, 0), NOW).error_code == E.KAFKA_STORAGE_ERROR
    with pytest.raises(KafkaProtocolError) as exc:
        p.read(0, 1 << 20)
    assert exc.value.code == E.KAFKA_STORAGE_ERROR
    p.close()
    env.p = env.open()
    assert not env.p.log.offline and env.p.log_end_offset == 3
    r = env.p.append_from_client(txn_batch(A, 0), NOW)   # producer state came back with the log
    assert (r.error_code, r.base_offset, r.extra.get("duplicate")) == (0, 0, "latest")
