"""The partition side of transactions: open transactions, LSO, the aborted-transaction index and
its query, and the read_committed filter (Kafka's ProducerStateManagerTest, TransactionIndexTest)."""
from __future__ import annotations

import pytest

from oncelog.core.txn.partition import (
    ENTRY_SIZE,
    NO_OFFSET,
    AbortedTxn,
    AbortedTxnIndex,
    CompletedTxn,
    PartitionTxns,
    collect_aborted,
)
from oncelog.core.txn.read_committed import ReadCommittedFilter
from oncelog.protocol.errors import ErrorCode as E


def test_no_transactions_lso_is_the_high_watermark():
    t = PartitionTxns()
    assert t.last_stable_offset(42) == 42 and t.first_unstable_offset(42) == NO_OFFSET
    t.on_data_batch(1, 0, is_transactional=False)
    assert t.last_stable_offset(42) == 42


def test_open_transaction_holds_the_lso_until_its_marker_is_below_the_high_watermark():
    t = PartitionTxns()
    t.on_data_batch(1, 10, True)
    t.on_data_batch(1, 12, True)  # the same transaction
    assert t.open_first_offset(1) == 10 and t.has_open(1)
    assert t.last_stable_offset(15) == 10
    c = t.prepare_marker(1, 15, is_abort=False)
    assert c == CompletedTxn(1, 10, 15, False, 16)
    assert t.last_stable_offset(15) == 10  # prepare changes nothing
    t.complete(c)
    assert not t.has_open(1)
    assert t.last_stable_offset(15) == 10  # marker at 15 not below the high watermark yet
    assert t.last_stable_offset(16) == 16


def test_first_unstable_offset_kafka_scenario():
    """ProducerStateManagerTest.testFirstUnstableOffset, in offsets."""
    t = PartitionTxns()
    t.on_data_batch(1, 99, True)
    assert t.first_unstable_offset(100) == 99
    t.on_data_batch(2, 101, True)
    assert t.first_unstable_offset(102) == 99
    c1 = t.prepare_marker(1, 105, is_abort=False)
    t.complete(c1)
    assert t.first_unstable_offset(102) == 99  # marker above the high watermark
    assert t.first_unstable_offset(106) == 101
    c2 = t.prepare_marker(2, 110, is_abort=True)
    t.complete(c2)
    assert t.first_unstable_offset(106) == 101
    assert t.first_unstable_offset(111) == NO_OFFSET


def test_stable_offset_at_completion_is_the_next_open_transaction_of_another_producer():
    t = PartitionTxns()
    t.on_data_batch(1, 0, True)
    t.on_data_batch(2, 5, True)
    t.on_data_batch(3, 7, True)
    assert t.prepare_marker(1, 10, True).last_stable_offset == 5
    assert t.prepare_marker(2, 10, True).last_stable_offset == 0
    t.complete(t.prepare_marker(2, 10, True))
    assert t.prepare_marker(1, 11, True).last_stable_offset == 7
    t.complete(t.prepare_marker(1, 11, True))
    assert t.prepare_marker(3, 12, True).last_stable_offset == 13


def test_non_transactional_batch_while_a_transaction_is_open():
    t = PartitionTxns()
    t.on_data_batch(1, 0, True)
    assert t.check_data_batch(1, is_transactional=False) == E.INVALID_TXN_STATE
    assert t.check_data_batch(1, is_transactional=True) == E.NONE
    assert t.check_data_batch(2, is_transactional=False) == E.NONE


def test_marker_without_an_open_transaction_completes_nothing():
    t = PartitionTxns()
    assert t.prepare_marker(1, 3, True) is None
    with pytest.raises(ValueError):
        t.complete(CompletedTxn(1, 0, 3, True, 4))


def test_lso_never_below_the_log_start():
    t = PartitionTxns()
    t.on_data_batch(1, 5, True)
    assert t.last_stable_offset(50, log_start_offset=20) == 20
    assert t.last_stable_offset(10, log_start_offset=20) == 10  # never above the high watermark


def test_snapshot_round_trip():
    t = PartitionTxns()
    for pid, off in ((1, 3), (2, 8), (3, 9)):
        t.on_data_batch(pid, off, True)
    t.complete(t.prepare_marker(2, 12, False))
    snap = t.open_transactions()
    assert snap == [(1, 3), (3, 9)]
    u = PartitionTxns()
    u.load(snap)
    assert u.open_transactions() == snap and u.last_stable_offset(20) == 3
    assert u.prepare_marker(1, 20, True).last_stable_offset == 9
    with pytest.raises(ValueError):
        u.load([(1, 3), (1, 4)])


def test_many_short_transactions_behind_a_long_one_stay_cheap():
    t = PartitionTxns()
    t.on_data_batch(0, 0, True)
    off = 1
    for i in range(1, 5000):
        t.on_data_batch(i, off, True)
        t.complete(t.prepare_marker(i, off + 1, True))
        off += 2
    assert t.last_stable_offset(off) == 0
    assert len(t._q_first) - t._q_head <= 2 * len(t) + 1024  # stale entries do not pile up
    t.complete(t.prepare_marker(0, off, False))
    assert t.last_stable_offset(off + 1) == off + 1


# ---------------------------------------------------------------------------- the index

def test_index_bytes_are_kafkas():
    idx = AbortedTxnIndex()
    idx.append(CompletedTxn(7, 10, 20, True, 21))
    idx.append(AbortedTxn(8, 15, 30, 16))
    raw = idx.encode()
    assert len(raw) == 2 * ENTRY_SIZE == 68
    assert raw[:ENTRY_SIZE] == (b"\x00\x00" + (7).to_bytes(8, "big") + (10).to_bytes(8, "big")
                                + (20).to_bytes(8, "big") + (21).to_bytes(8, "big"))
    assert list(AbortedTxnIndex.decode(raw).entries()) == list(idx.entries())
    assert idx.encode_from(1) == raw[ENTRY_SIZE:]


def test_index_torn_tail_is_dropped_and_bad_entries_refused():
    idx = AbortedTxnIndex()
    idx.append(AbortedTxn(7, 10, 20, 21))
    raw = idx.encode()
    assert len(AbortedTxnIndex.decode(raw + raw[:11])) == 1
    with pytest.raises(ValueError):
        AbortedTxnIndex.decode(b"\x00\x01" + raw[2:])
    with pytest.raises(ValueError):
        AbortedTxnIndex.decode(raw + _index((2, 0, 8, 9)).encode())  # out of marker order
    with pytest.raises(ValueError):
        AbortedTxnIndex.decode(_index((2, 30, 20, 21)).encode())  # ends before it starts
    bad = AbortedTxnIndex()
    with pytest.raises(ValueError):
        bad.append(CompletedTxn(1, 0, 3, False, 4))  # commits are not indexed
    bad.append(AbortedTxn(1, 0, 9, 10))
    with pytest.raises(ValueError):
        bad.append(AbortedTxn(2, 0, 8, 9))  # out of marker order


def test_index_truncation_drops_markers_at_or_above_the_new_end():
    idx = AbortedTxnIndex()
    for last in (5, 9, 14):
        idx.append(AbortedTxn(last, 0, last, last + 1))
    idx.truncate_to(9)
    assert [e.last_offset for e in idx.entries()] == [5]


def _index(*entries):
    idx = AbortedTxnIndex()
    for e in entries:
        idx.append(AbortedTxn(*e))
    return idx


def test_collect_follows_kafkas_rules():
    """TransactionIndexTest.testCollectAbortedTransactions."""
    a = [(0, 0, 10, 11), (1, 5, 10, 13), (2, 18, 35, 25), (3, 32, 50, 40)]
    idx = _index(*a)
    q = collect_aborted([idx], 0, 32)
    assert [tuple(t) for t in q.transactions] == a[:3] and q.upper == 32
    q = collect_aborted([idx], 0, 35)
    assert [tuple(t) for t in q.transactions] == a
    q = collect_aborted([idx], 11, 15)
    assert [tuple(t) for t in q.transactions] == []
    q = collect_aborted([idx], 10, 15)
    assert [tuple(t) for t in q.transactions] == a[:2]


def test_collect_walks_later_segments_until_an_lso_reaches_the_end():
    seg1 = _index((1, 0, 4, 2), (2, 2, 6, 3))
    seg2 = _index((3, 3, 12, 7), (4, 9, 14, 15), (5, 20, 25, 26))
    q = collect_aborted([seg1, seg2], 3, 8)
    assert [t.producer_id for t in q.transactions] == [1, 2, 3]
    q = collect_aborted([seg1, seg2], 3, 16)
    assert [t.producer_id for t in q.transactions] == [1, 2, 3, 4]


def test_collect_with_a_scan_bound_lowers_the_upper_bound():
    # producer 9's transaction (from 1) stays open across many aborts of others
    entries = [(100 + k, 10 + 2 * k, 11 + 2 * k, 1) for k in range(50)] + [(9, 1, 200, 201)]
    idx = _index(*entries)
    full = collect_aborted([idx], 0, 150)
    assert {t.producer_id for t in full.transactions} >= {9}
    bounded = collect_aborted([idx], 0, 150, max_scan=10)
    assert bounded.upper == 1  # no progress possible: the caller asks again without the bound
    entries = [(k, 2 * k, 2 * k + 1, 2 * k + 2) for k in range(50)]
    idx = _index(*entries)
    bounded = collect_aborted([idx], 0, 80, max_scan=10)
    assert bounded.upper == 20
    assert bounded.transactions == [t for t in collect_aborted([idx], 0, 80).transactions if t.first_offset < 20]


# ---------------------------------------------------------------------------- the consumer's filter

def test_read_committed_filter():
    f = ReadCommittedFilter([(1, 0), (2, 10)])
    assert f.accept(3, 1, is_transactional=False, is_control=False)
    assert not f.accept(1, 1, True, False)            # aborted
    assert f.accept(2, 5, True, False)                # producer 2's aborted txn starts at 10
    assert not f.accept(1, 6, True, True, is_abort_marker=True)  # the marker, never returned
    assert f.accept(1, 8, True, False)                # producer 1's next transaction
    assert not f.accept(2, 12, True, False)
    assert not f.accept(2, 13, True, True, is_abort_marker=False)  # a commit marker: not returned
    assert not f.accept(2, 14, True, False)           # only its ABORT marker ends it
