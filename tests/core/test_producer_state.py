"""Producer state rules, including our versions of Kafka's ProducerStateManagerTest and the
UnifiedLogTest duplicate cases (kafka_broker.md §4), on the sans-IO core.

Kafka test -> ours (partition- and file-level ones are in tests/storage/test_partition*.py and
tests/storage/test_producer_snapshots.py):
  testBasicIdMapping                      test_basic_id_mapping
  testProducerSequenceWrapAround          test_producer_sequence_wrap_around
  testProducerSequenceWithWrapAroundBatchRecord  test_producer_sequence_with_wrap_around_batch_record
  testProducerSequenceInvalidWrapAround   test_producer_sequence_invalid_wrap_around
  testNoValidationOnFirstEntryWhenLoadingLog     test_no_validation_on_first_entry_when_loading_log
  testAcceptAppendWithSequenceGapsOnReplica      test_accept_sequence_gaps_on_replay
  testPrepareUpdateDoesNotMutate          test_prepare_update_does_not_mutate
  testPidExpirationTimeout                test_pid_expiration_timeout (UNKNOWN_PRODUCER_ID, by the seed)
  testRemoveExpiredPidsOnReload / testLoadFromSnapshotRetainsNonExpiredProducers
                                          test_remove_expired_pids_on_reload
  testAllowNonZeroSequenceOnFirstAppendNonZeroEpoch  test_allow_zero_sequence_on_first_append_any_epoch
  UnifiedLogTest.testDuplicateAppends     test_duplicate_appends_window_5 (+ test_partition.py)
  UnifiedLogTest.testNonSequentialAppend / testOldProducerEpoch  test_non_sequential_append_and_old_epoch
  testReadWriteSnapshot, testLoadFrom{Empty,Truncated,Corrupt}SnapshotFile  test_producer_snapshots.py
  testTakeSnapshot, testSkipSnapshotIfOffsetUnchanged, testTruncateAndReloadRemovesOutOfRangeSnapshots,
  testProducerIdExpirationOnSegmentDeletion, testPeriodicProducerIdExpiration,
  testProducerSnapshotAfterSegmentRollOnAppend, testProducerIdMapTruncateTo   test_partition.py
Not applicable (oncelog has no transactions, coordinators or followers): the txn-marker, control
record epoch bump, coordinator fencing, ongoing-transaction, first-unstable-offset and
verification-state tests, and the follower (REPLICATION origin) dedup tests.
"""
from __future__ import annotations

import pytest

from oncelog.core import producer_state as ps
from oncelog.core.producer_state import APPEND, DUPLICATE, LOOKUP, REFUSE, ProducerStateConfig, ProducerStateManager
from oncelog.core.sequence import MAX_SEQUENCE, last_sequence
from oncelog.protocol.errors import ErrorCode as E

PID = 1000
KEY = 0x0123456789ABCDEF  # storage draws the hash key per partition; tests pass one


def manager(**kw) -> ProducerStateManager:
    return ProducerStateManager(ProducerStateConfig(**kw), hash_key=KEY)


class Log:
    """Drives a manager like a partition does: check, then append at the next offset and commit."""

    def __init__(self, m: ProducerStateManager) -> None:
        self.m = m
        self.next_offset = 0

    def produce(self, pid: int, epoch: int, first: int, count: int = 1, now: int = 0):
        c = self.m.check(pid, epoch, first, last_sequence(first, count - 1))
        if c.kind == APPEND:
            base = self.next_offset
            self.next_offset += count
            self.m.commit(c, base, 1000 + base, now)
            return ("appended", base)
        if c.kind == DUPLICATE:
            return ("duplicate", c.base_offset)
        return ("error", E(c.error), c)


def err(result) -> E | None:
    return result[1] if result[0] == "error" else None


# ---------------------------------------------------------------- ProducerStateManagerTest

def test_basic_id_mapping():
    log = Log(manager())
    assert log.produce(PID, 0, 0) == ("appended", 0)
    assert log.produce(PID, 0, 1) == ("appended", 1)
    # Kafka's manager says OutOfOrder here because dedup happens in the log; ours answers it.
    assert log.produce(PID, 0, 1) == ("duplicate", 1)
    assert err(log.produce(PID, 0, 5)) == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.produce(PID, 1, 0) == ("appended", 2)
    assert err(log.produce(PID, 0, 2)) == E.INVALID_PRODUCER_EPOCH


def test_producer_sequence_wrap_around():
    m = manager()
    m.record(PID, 0, MAX_SEQUENCE - 1, MAX_SEQUENCE, 10, -1, 0)
    log = Log(m)
    log.next_offset = 11
    assert log.produce(PID, 0, 0) == ("appended", 11)


def test_producer_sequence_with_wrap_around_batch_record():
    m = manager()
    m.record(PID, 0, MAX_SEQUENCE - 20, MAX_SEQUENCE - 11, 0, -1, 0)
    log = Log(m)
    log.next_offset = 10
    assert log.produce(PID, 0, MAX_SEQUENCE - 10, 21) == ("appended", 10)  # MAX-10 .. 9
    assert m.entry(PID).last_sequence == 9
    assert log.produce(PID, 0, MAX_SEQUENCE - 10, 21) == ("duplicate", 10)
    assert log.produce(PID, 0, 10) == ("appended", 31)


def test_producer_sequence_invalid_wrap_around():
    m = manager()
    m.record(PID, 0, MAX_SEQUENCE, MAX_SEQUENCE, 0, -1, 0)
    assert err(Log(m).produce(PID, 0, 1)) == E.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_no_validation_on_first_entry_when_loading_log():
    m = manager()
    m.record(PID, 5, 16, 16, 0, -1, 0)  # replay of the log accepts anything
    assert m.entry(PID).epoch == 5 and m.entry(PID).last_sequence == 16


def test_prepare_update_does_not_mutate():
    m = manager()
    log = Log(m)
    log.produce(PID, 0, 0, 3)
    before = (list(m.entries()), m.memory_bytes())
    for args in ((PID, 0, 3, 5), (PID, 0, 0, 2), (PID, 1, 0, 0), (PID, 0, 9, 9), (PID + 1, 0, 0, 0),
                 (PID + 1, 0, 4, 4)):
        m.check(*args)
    assert (list(m.entries()), m.memory_bytes()) == before
    assert PID + 1 not in m


def test_pid_expiration_timeout():
    m = manager(expiration_ms=5000)
    log = Log(m)
    log.produce(PID, 0, 0, now=100)
    assert m.remove_expired(5099) == 0
    assert m.remove_expired(5100) == 1
    assert PID not in m
    # Kafka 2.5+ accepts seq 1 here; the seed's rule answers UNKNOWN_PRODUCER_ID instead.
    assert err(log.produce(PID, 0, 1)) == E.UNKNOWN_PRODUCER_ID
    assert log.produce(PID, 0, 0)[0] == "appended"


def test_allow_zero_sequence_on_first_append_any_epoch():
    # Kafka's testAllowNonZeroSequenceOnFirstAppendNonZeroEpoch: we require 0 from an unknown
    # producer (anything else is UNKNOWN_PRODUCER_ID), whatever its epoch.
    log = Log(manager())
    assert err(log.produce(PID, 3, 7)) == E.UNKNOWN_PRODUCER_ID
    assert log.produce(PID, 3, 0) == ("appended", 0)


def test_new_epoch_must_start_at_zero():
    log = Log(manager())
    log.produce(PID, 0, 0, 4)
    r = log.produce(PID, 1, 4)
    assert err(r) == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert "new epoch" in r[2].message
    assert log.produce(PID, 1, 0) == ("appended", 4)
    # the old epoch's batches can no longer be duplicates
    assert err(log.produce(PID, 0, 0, 4)) == E.INVALID_PRODUCER_EPOCH


def test_remove_expired_pids_on_reload():
    m = manager(expiration_ms=1000)
    log = Log(m)
    log.produce(1, 0, 0, now=0)
    log.produce(2, 0, 0, now=900)
    cols = m.columns()
    m2 = manager(expiration_ms=1000)
    m2.load_columns(cols, now_ms=1500)
    assert 1 not in m2 and 2 in m2
    assert m2.entry(2).batches == m.entry(2).batches


# ---------------------------------------------------------------- UnifiedLogTest.testDuplicateAppends

def test_duplicate_appends_window_5():
    log = Log(manager())
    offsets = [log.produce(PID, 0, seq * 2, 2)[1] for seq in range(10)]  # 10 batches of 2
    # the tail batch
    assert log.produce(PID, 0, 18, 2) == ("duplicate", offsets[9])
    # a partial duplicate
    assert err(log.produce(PID, 0, 17, 2)) == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert err(log.produce(PID, 0, 18, 1)) == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    # 4th from the tail (still retained)
    assert log.produce(PID, 0, 12, 2) == ("duplicate", offsets[6])
    assert log.produce(PID, 0, 10, 2) == ("duplicate", offsets[5])
    # older than the 5 retained: the mode's error (after an optional log-tail lookup)
    c = log.m.check(PID, 0, 8, 9)
    assert c.kind == LOOKUP and c.error == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert c.base_offset == offsets[5]  # scan strictly below the oldest retained batch
    assert log.next_offset == 20


def test_non_sequential_append_and_old_epoch():
    log = Log(manager())
    log.produce(PID, 2, 0)
    assert err(log.produce(PID, 2, 2)) == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert err(log.produce(PID, 1, 1)) == E.INVALID_PRODUCER_EPOCH


# ---------------------------------------------------------------- the cases

def _fill(log: Log, n: int, size: int = 3) -> list[int]:
    return [log.produce(PID, 0, i * size, size)[1] for i in range(n)]


def test_duplicate_15_back_on_window_20_answers_original_offset():
    log = Log(manager(batches_to_retain=20))
    offsets = _fill(log, 30)
    assert log.produce(PID, 0, 14 * 3, 3) == ("duplicate", offsets[14])
    c = log.m.check(PID, 0, 14 * 3, 14 * 3 + 2)
    assert c.duplicate_kind == ps.DUP_WINDOW
    assert log.m.check(PID, 0, 29 * 3, 29 * 3 + 2).duplicate_kind == ps.DUP_LATEST


def test_duplicate_15_back_on_window_5_is_refused():
    log = Log(manager(batches_to_retain=5))
    _fill(log, 30)
    end = log.next_offset
    c = log.m.check(PID, 0, 14 * 3, 14 * 3 + 2)
    assert c.kind == LOOKUP and c.error == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.next_offset == end


def test_window_change_takes_effect_for_next_batches():
    m = manager(batches_to_retain=5)
    log = Log(m)
    offsets = _fill(log, 8)
    m.reconfigure(ProducerStateConfig(batches_to_retain=20))
    # the five retained survive the re-layout; older ones are gone
    assert log.produce(PID, 0, 3 * 3, 3) == ("duplicate", offsets[3])
    assert m.check(PID, 0, 2 * 3, 2 * 3 + 2).kind == LOOKUP
    offsets += _fill_from(log, 8, 20)
    assert log.produce(PID, 0, 9 * 3, 3) == ("duplicate", offsets[9])  # 19 back
    m.reconfigure(ProducerStateConfig(batches_to_retain=5))
    assert m.check(PID, 0, 9 * 3, 9 * 3 + 2).kind == LOOKUP
    assert log.produce(PID, 0, 23 * 3, 3) == ("duplicate", offsets[23])
    assert len(m.entry(PID).batches) == 5


def _fill_from(log: Log, start: int, n: int, size: int = 3) -> list[int]:
    return [log.produce(PID, 0, i * size, size)[1] for i in range(start, start + n)]


def test_range_mode_duplicate_within_range_out_of_order_beyond():
    m = manager(dedup_mode="range", max_in_flight_sequence_number=1000)
    log = Log(m)
    offsets = _fill(log, 500, 3)  # sequences 0..1499
    assert len(m.entry(PID).batches) == 1
    assert log.produce(PID, 0, 1497, 3) == ("duplicate", offsets[-1])  # the latest: offset known
    c = m.check(PID, 0, 1200, 1202)
    assert c.kind == LOOKUP and c.error == E.DUPLICATE_SEQUENCE_NUMBER
    c = m.check(PID, 0, 500, 502)  # 999 below the latest last sequence 1499
    assert c.kind == LOOKUP
    c = m.check(PID, 0, 499, 501)  # 1000 below: outside the range
    assert c.kind == REFUSE and c.error == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    c = m.check(PID, 0, 1498, 1502)  # straddles the latest: not all appended
    assert c.kind == REFUSE and c.error == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    c = m.check(PID, 0, 1501, 1501)  # a gap ahead
    assert c.kind == REFUSE and c.error == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.produce(PID, 0, 1500, 1)[0] == "appended"


def test_range_mode_across_wraparound():
    m = manager(dedup_mode="range", max_in_flight_sequence_number=100)
    m.record(PID, 0, MAX_SEQUENCE - 49, 20, 0, -1, 0)  # latest batch wraps: MAX-49 .. 20
    assert m.check(PID, 0, 21, 21).kind == APPEND
    for first, last in ((MAX_SEQUENCE - 60, MAX_SEQUENCE - 55), (MAX_SEQUENCE, 5), (0, 0),
                        (MAX_SEQUENCE - 78, MAX_SEQUENCE - 78)):
        c = m.check(PID, 0, first, last)
        assert c.kind == LOOKUP and c.error == E.DUPLICATE_SEQUENCE_NUMBER, (first, c)
    c = m.check(PID, 0, MAX_SEQUENCE - 79, MAX_SEQUENCE - 79)  # exactly 100 below 20
    assert c.kind == REFUSE and c.error == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    c = m.check(PID, 0, 22, 30)
    assert c.kind == REFUSE and c.error == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    c = m.check(PID, 0, MAX_SEQUENCE - 49, 20)
    assert c.kind == DUPLICATE and c.duplicate_kind == ps.DUP_LATEST


def test_window_mode_duplicate_across_wraparound():
    m = manager(batches_to_retain=5)
    log = Log(m)
    m.record(PID, 0, MAX_SEQUENCE - 9, MAX_SEQUENCE - 5, 0, -1, 0)
    log.next_offset = 5
    assert log.produce(PID, 0, MAX_SEQUENCE - 4, 10) == ("appended", 5)  # MAX-4 .. 4
    assert log.produce(PID, 0, 5, 5) == ("appended", 15)
    assert log.produce(PID, 0, MAX_SEQUENCE - 4, 10) == ("duplicate", 5)
    assert log.produce(PID, 0, MAX_SEQUENCE - 9, 5) == ("duplicate", 0)


def test_mode_switch_keeps_latest_batch():
    m = manager()
    log = Log(m)
    offsets = _fill(log, 6)
    m.reconfigure(ProducerStateConfig(dedup_mode="range"))
    assert m.entry(PID).batches == ((15, 17, offsets[5], 1000 + offsets[5]),)
    assert m.check(PID, 0, 12, 14).kind == LOOKUP
    m.reconfigure(ProducerStateConfig(dedup_mode="window", batches_to_retain=7))
    assert log.produce(PID, 0, 18, 3)[0] == "appended"
    assert len(m.entry(PID).batches) == 2


def test_many_producers_hash_table_insert_expire_lookup():
    m = manager(expiration_ms=10)
    log = Log(m)
    pids = [p * 7919 + (p << 40) for p in range(5000)]
    for i, p in enumerate(pids):
        log.produce(p, 0, 0, now=i % 2 * 100)
    assert len(m) == 5000
    assert m.remove_expired(50) == 2500  # those seen at 0
    for i, p in enumerate(pids):
        assert (p in m) == (i % 2 == 1)
        if i % 2:
            assert log.produce(p, 0, 0)[0] == "duplicate"
            assert log.produce(p, 0, 1)[0] == "appended"
        else:
            assert err(log.produce(p, 0, 1)) == E.UNKNOWN_PRODUCER_ID


def test_config_validation_and_from_topic_config():
    with pytest.raises(ValueError):
        ProducerStateConfig(batches_to_retain=4)
    with pytest.raises(ValueError):
        ProducerStateConfig(max_in_flight_sequence_number=2**30 + 1)
    with pytest.raises(ValueError):
        ProducerStateConfig(dedup_mode="latest")
    cfg = ProducerStateConfig.from_topic_config({"producer.state.batches.to.retain": "20",
                                                 "producer.state.dedup.mode": "RANGE", "segment.bytes": 1000})
    assert cfg.batches_to_retain == 20 and cfg.dedup_mode == "range" and cfg.stride == 1
    # Kafka's names only: an attribute-style spelling is another topic's config, not this one
    assert ProducerStateConfig.from_topic_config({"producer_state_batches_to_retain": 7,
                                                  "message.format.version": "2"}).batches_to_retain == 5


def test_memory_is_packed():
    m = manager(batches_to_retain=5)
    log = Log(m)
    for p in range(20000):
        log.produce(p, 0, 0)
    per = m.memory_bytes() / len(m)
    assert per <= 200, per
    r = manager(dedup_mode="range")
    log = Log(r)
    for p in range(20000):
        log.produce(p, 0, 0)
    assert r.memory_bytes() / len(r) <= 64


def test_accept_sequence_gaps_on_replay():
    m = manager()
    m.record(PID, 0, 0, 0, 0, -1, 0)
    m.record(PID, 0, 7, 9, 1, -1, 0)   # the log is trusted at replay: no sequence check
    m.record(PID, 0, 40, 40, 4, -1, 0)
    assert [b[:2] for b in m.entry(PID).batches] == [(0, 0), (7, 9), (40, 40)]
    assert m.check(PID, 0, 41, 41).kind == APPEND
    assert m.check(PID, 0, 7, 9).kind == DUPLICATE


# -------------------------------------------------------------- issue 13: bounded work per request

def _ids_colliding_under_the_public_hash(n: int) -> list[int]:
    """Producer ids that all share one home slot under the old, public multiplicative hash
    (pid * 0x9E3779B97F4A7C15): pid * MUL = 1, 2, 3, ... so their top bits are all zero."""
    mul_inverse = pow(0x9E3779B97F4A7C15, -1, 1 << 64)
    ids, i = [], 1
    while len(ids) < n:
        pid = (mul_inverse * i) & ((1 << 64) - 1)
        if pid < 2**63:
            ids.append(pid)
        i += 1
    return ids


def test_chosen_producer_ids_do_not_share_a_probe_chain():
    ids = _ids_colliding_under_the_public_hash(8000)
    m = manager()
    log = Log(m)
    for pid in ids:
        assert log.produce(pid, 0, 0)[0] == "appended"
    probes = [m.probe_length(pid) for pid in ids]
    # Linear probing at most 3/4 full: a few probes on average whatever the ids; with the public
    # hash every id sat on one chain (8000 probes for the last, 12 s of CPU for these inserts).
    assert sum(probes) / len(probes) < 4 and max(probes) < 100
    for pid in ids[::97]:
        assert log.produce(pid, 0, 0)[0] == "duplicate"
    assert m.remove_expired(10**15) == 8000 and len(m) == 0


def test_the_hash_key_is_the_callers():
    # Storage draws the key (as it passes the clock): the core holds no source of randomness.
    with pytest.raises(TypeError):
        ProducerStateManager(ProducerStateConfig())
    a, b = ProducerStateManager(hash_key=1), ProducerStateManager(hash_key=2)
    ids = list(range(64))
    assert [a._index._home(p) for p in ids] != [b._index._home(p) for p in ids]
    c = ProducerStateManager(hash_key=1)
    assert [a._index._home(p) for p in ids] == [c._index._home(p) for p in ids]
    # the remembered set's table has a key of its own, and keeps it through a snapshot load
    a.record(7, 0, 0, 0, 0, -1, 0)
    a.remove_expired(10**15)
    key = a.expired._key
    assert key != a._key
    a.load_columns(a.columns())
    assert a.expired._key == key and 7 in a.expired


def test_producer_cap_evicts_the_least_recently_updated_producer():
    m = manager(max_producers=3)
    log = Log(m)
    assert log.produce(1, 0, 0, now=10) == ("appended", 0)
    log.produce(2, 0, 0, now=5)     # the least recently updated
    log.produce(3, 0, 0, now=20)
    assert log.produce(4, 0, 0, now=30) == ("appended", 3)  # never refused
    assert 2 not in m and {1, 3, 4} <= set(e.producer_id for e in m.entries())
    # the evicted producer is remembered with where its batch is, for storage to restore it
    assert m.expired.get(2) == ((1,), 1) and m.evictions == 1
    assert err(log.produce(2, 0, 1)) == E.UNKNOWN_PRODUCER_ID  # the core alone cannot restore it
    m.record(2, 0, 0, 0, 1, -1, 40)  # what a restore does: the log's batch, recorded again
    assert 2 in m and 2 not in m.expired and len(m) == 3 and m.evictions == 2  # 1 went (now=10)
    assert 1 in m.expired


def test_eviction_scans_a_bounded_number_of_producers():
    # 1,000 producers at the cap: each new one compares EVICTION_SCAN of them, not all, and the
    # hand goes round, so over n / EVICTION_SCAN evictions every slot is looked at.
    m = manager(max_producers=1000)
    for pid in range(1000):
        m.record(pid, 0, 0, 0, pid, -1, 10_000 - pid)  # pid 999 is the least recently updated
    reads = []
    real = m._updated
    m._updated = CountingArray(real, reads)
    m.record(5000, 0, 0, 0, 5000, -1, 20_000)
    # the scan, plus the new slot's own update and the swap-remove's move of the last slot
    assert len(reads) <= ps.EVICTION_SCAN + 2
    evicted = [pid for pid in range(1000) if pid not in m]
    assert evicted == [ps.EVICTION_SCAN - 1]  # the least recently updated of the first window
    m._updated = real
    for pid in range(5001, 5000 + 1000 // ps.EVICTION_SCAN + 2):
        m.record(pid, 0, 0, 0, pid, -1, 20_000)
    assert 999 not in m and len(m) == 1000  # the hand went round to the least recently updated of all


class CountingArray:
    """Counts element reads of the array it wraps (only what _evict_one uses)."""

    def __init__(self, arr, reads):
        self._arr, self._reads = arr, reads

    def __getitem__(self, i):
        item = self._arr[i]
        self._reads.extend(item if isinstance(i, slice) else [item])
        return item

    def __setitem__(self, i, v):
        self._arr[i] = v

    def __len__(self):
        return len(self._arr)

    def append(self, v):
        self._arr.append(v)

    def pop(self, *a):
        return self._arr.pop(*a)


def test_a_lowered_cap_evicts_down_to_it():
    m = manager(max_producers=10)
    for pid in range(10):
        m.record(pid, 0, 0, 0, pid, -1, pid)
    m.reconfigure(ProducerStateConfig(max_producers=4))
    assert sorted(e.producer_id for e in m.entries()) == [6, 7, 8, 9]
    assert sorted(p for p, _r in m.expired.items()) == [0, 1, 2, 3, 4, 5]


def test_expired_producers_are_remembered_with_their_batch_offsets():
    m = manager(expiration_ms=10)
    log = Log(m)
    for first in (0, 2, 4):
        log.produce(PID, 0, first, 2)
    log.produce(7, 0, 0, now=100)
    assert m.remove_expired(50) == 1
    # the base offset of every batch it retained, and the last offset of its newest
    assert m.expired.get(PID) == ((0, 2, 4), 5) and 7 not in m.expired
    m.forget_expired_before(5)
    assert PID in m.expired   # its newest batch still has an offset in the log
    m.forget_expired_before(6)
    assert PID not in m.expired
    m.forget_expired_before(7)
    m.remove_expired(10**6)
    assert 7 not in m.expired  # wholly below the log start: nothing to restore it from
    m.record(7, 0, 1, 1, 200, -1, 10**6)
    assert 7 in m


def test_remembered_offsets_follow_the_window():
    m = manager(expiration_ms=1, batches_to_retain=8)
    for b in range(8):
        m.record(PID, 0, b, b, 10 * b, -1, 0)
    m.remove_expired(10)
    assert m.expired.get(PID).offsets == tuple(range(0, 80, 10))
    m.reconfigure(ProducerStateConfig(expiration_ms=1, batches_to_retain=5))
    assert m.expired.get(PID) == ((30, 40, 50, 60, 70), 70)
    m.reconfigure(ProducerStateConfig(expiration_ms=1, batches_to_retain=20))
    assert m.expired.get(PID) == ((30, 40, 50, 60, 70), 70)
    m.reconfigure(ProducerStateConfig(expiration_ms=1, dedup_mode="range"))
    assert m.expired.get(PID) == ((70,), 70)


def test_remembered_producers_are_bounded_and_the_forgotten_leave_a_watermark():
    m = manager(expiration_ms=1, max_remembered=1000)
    assert m.state_start == 0
    for pid in range(1500):
        m.record(pid, 0, 0, 1, 2 * pid, -1, 0)   # two records each: offsets 2*pid, 2*pid+1
    m.remove_expired(10)
    # those whose newest batch is oldest go first, down to 9/10 of the budget
    assert len(m.expired) == 900 and min(r.end for _p, r in m.expired.items()) == 2 * 600 + 1
    assert m.expired.forgotten == 600
    # everything a forgotten producer wrote lies below the producer-state start
    assert m.state_start == 2 * 599 + 2
    m.forget_expired_before(10**6)
    assert m.state_start == 2 * 599 + 2  # deletion does not lower it: the log start covers it
    m.expired.forget_outside(0, 1000)    # a truncation does: what lay above the new end is gone
    assert m.state_start == 1000


def test_a_budget_of_zero_remembers_nobody():
    m = manager(expiration_ms=1, max_remembered=0)
    m.record(PID, 0, 0, 4, 100, -1, 0)
    m.remove_expired(10)
    assert len(m.expired) == 0 and m.state_start == 105


def test_lookup_bounds_are_what_the_topic_config_accepts():
    from oncelog.core.topic_config import TOPIC_CONFIGS
    for name, field in (("producer.state.duplicate.lookup.offsets", "duplicate_lookup_offsets"),
                        ("producer.state.expired.lookup.offsets", "expired_lookup_offsets"),
                        ("producer.state.batches.to.retain", "batches_to_retain"),
                        ("max.in.flight.sequence.number.per.connection", "max_in_flight_sequence_number"),
                        ("producer.state.max.producers.per.partition", "max_producers"),
                        ("producer.state.max.remembered.producers.per.partition", "max_remembered")):
        d = TOPIC_CONFIGS[name]
        ProducerStateConfig(**{field: d.minimum})
        ProducerStateConfig(**{field: d.maximum})
        with pytest.raises(ValueError):
            ProducerStateConfig(**{field: d.maximum + 1})
        with pytest.raises(ValueError):
            ProducerStateConfig(**{field: d.minimum - 1})
