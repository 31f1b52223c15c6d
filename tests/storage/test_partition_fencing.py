"""A partition's writes under its ownership lease (issue 34): the owner deposed while it was paused
changes nothing once a newer owner raised the token (appends, markers, truncation, snapshots, its
close), the new owner opens without waiting for it, and what the old owner wrote before the raise
is in the log the new owner reads. Plus the partition's own rules for what a marker or a
transactional batch may do: KIP-1228's Transactions V2 marker epochs, and a batch that would open
a transaction without a valid verification guard (Kafka's `batchMissingRequiredVerification`).

Two `Partition` objects over one directory play two brokers' processes (each lease has its own open
file, so their locks exclude each other as two processes' do)."""
from __future__ import annotations

import pytest

from oncelog.core.producer_state import ProducerStateConfig
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.errors import KafkaProtocolError
from oncelog.protocol.records import Record, encode_batch
from oncelog.storage import producer_snapshots as snaps
from oncelog.storage.fence import TOKEN_FILE, Lease
from oncelog.storage.log import CLEAN_SHUTDOWN, LogConfig
from oncelog.storage.partition import Partition, PartitionConfig

NOW = 1_700_000_000_000
PID = 4242


def batch(seq: int, epoch: int = 0, transactional: bool = False, pid: int = PID) -> bytearray:
    records = [Record(0, NOW, None, b"v%d" % seq, [])]
    return bytearray(encode_batch(records, producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                                  transactional=transactional))


def owner(directory, epoch: int) -> Partition:
    lease = Lease.take(directory / TOKEN_FILE, epoch, "t-0")
    return Partition.open("t", 0, directory, PartitionConfig(LogConfig(), ProducerStateConfig()), NOW,
                          leader_epoch=epoch, lease=lease)


def test_a_deposed_owner_writes_nothing_and_the_new_one_has_what_it_wrote_before(tmp_path):
    old = owner(tmp_path, 1)
    assert old.append_from_client(batch(0), NOW).error_code == E.NONE
    new = owner(tmp_path, 2)                       # no wait: the old one still has it open
    assert new.log_end_offset == 1                 # the old owner's append before the raise
    assert old.fenced and not new.fenced
    end = new.log_end_offset
    r = old.append_from_client(batch(1), NOW)      # a request that waited in the paused broker's socket
    assert r.error_code == E.NOT_LEADER_OR_FOLLOWER
    with pytest.raises(KafkaProtocolError) as e:
        old.append_marker(PID, 0, 0, True, NOW)
    assert e.value.code == E.NOT_LEADER_OR_FOLLOWER
    with pytest.raises(KafkaProtocolError):
        old.delete_records_before(1)
    snapshots = snaps.list_snapshots(tmp_path)
    old.close()                                    # dropped: no snapshot, no clean-shutdown marker
    assert snaps.list_snapshots(tmp_path) == snapshots and not (tmp_path / CLEAN_SHUTDOWN).exists()
    assert new.append_from_client(batch(1), NOW).error_code == E.NONE   # the producer's retry, at the new owner
    assert new.log_end_offset == end + 1
    new.log.flush()
    new.close()
    again = owner(tmp_path, 2)                     # the same owner restarted: everything, once
    assert again.log_end_offset == 2 and again.producer_state.epoch_of(PID) == 0
    again.close()


def test_a_v2_marker_needs_an_epoch_above_the_open_transaction(tmp_path):
    p = owner(tmp_path, 0)
    assert p.append_from_client(batch(0, epoch=5, transactional=True), NOW).error_code == E.NONE
    with pytest.raises(KafkaProtocolError) as e:   # the late marker of the transaction before (V2)
        p.append_marker(PID, 5, 0, True, NOW, transaction_version=2)
    assert e.value.code == E.INVALID_PRODUCER_EPOCH and p.txns.has_open(PID)
    p.append_marker(PID, 6, 0, True, NOW, transaction_version=2)        # its own, bumped
    assert not p.txns.has_open(PID)
    p.append_marker(PID, 6, 0, True, NOW, transaction_version=2)        # an exact retry: nothing open
    p.append_marker(PID, 6, 0, True, NOW, transaction_version=0)
    p.close()


def test_a_batch_that_would_open_a_transaction_needs_a_valid_guard(tmp_path):
    p = owner(tmp_path, 0)
    r = p.append_from_client(batch(0, transactional=True), NOW, verify=True)    # no guard: never verified
    assert r.error_code == E.INVALID_TXN_STATE and r.extra.get("unverified") and not p.txns.has_open(PID)
    guard = p.verification_guards.begin(PID, 0, False)
    p.append_marker(PID, 0, 0, True, NOW)          # the transaction ended while the check waited
    r = p.append_from_client(batch(0, transactional=True), NOW, verify=True, guard=guard)
    assert r.error_code == E.INVALID_TXN_STATE and not p.txns.has_open(PID)
    p.verification_guards.end(PID, guard)
    guard = p.verification_guards.begin(PID, 0, False)
    assert p.append_from_client(batch(0, transactional=True), NOW, verify=True, guard=guard).error_code == E.NONE
    p.verification_guards.end(PID, guard)
    # the transaction is open now: the next batch needs no guard
    assert p.append_from_client(batch(1, transactional=True), NOW, verify=True).error_code == E.NONE
    p.append_marker(PID, 0, 0, False, NOW)
    # and once it ended, a batch of the same epoch needs one again
    r = p.append_from_client(batch(2, transactional=True), NOW, verify=True)
    assert r.error_code == E.INVALID_TXN_STATE and not p.txns.has_open(PID)
    p.close()


def test_a_dropped_partition_starts_no_fsync_and_its_waiters_are_not_durable(tmp_path):
    """Appends of the deposed owner still waiting for their group commit: the partition it drops
    is offline, so no fsync starts on its closed files (an EBADF in the group commit before)."""
    old = owner(tmp_path, 1)
    assert old.append_from_client(batch(0), NOW).error_code == E.NONE
    assert old.durable_end_offset < old.log_end_offset      # appended, not fsynced yet
    new = owner(tmp_path, 2)
    old.drop()
    assert old.offline and old.begin_sync(NOW) is None
    assert new.log_end_offset == 1
    new.close()


def test_a_request_that_waited_while_its_partition_was_dropped_is_refused_as_not_leader(tmp_path):
    """A Produce holds its Partition across an await (a KIP-890 verification); the broker paused
    meanwhile, a newer owner raised the token and the broker dropped the partition, closing its
    lease. The append then answers NOT_LEADER_OR_FOLLOWER (its producer retries at the new
    leader): it failed on the lease's closed mmap before, a handler bug answered
    UNKNOWN_SERVER_ERROR (CI, test_txn_verify under pauses and over SASL_SSL)."""
    old = owner(tmp_path, 1)
    new = owner(tmp_path, 2)
    assert old.fenced
    old.drop()                                          # get_partition saw it fenced
    r = old.append_from_client(batch(0), NOW)
    assert r.error_code == E.NOT_LEADER_OR_FOLLOWER and "epoch 2" in (r.error_message or "")
    with pytest.raises(KafkaProtocolError) as e:
        old.append_marker(PID, 0, 0, True, NOW)
    assert e.value.code == E.NOT_LEADER_OR_FOLLOWER
    old.close()                                         # a shutdown after the drop: nothing to do
    new.close()
