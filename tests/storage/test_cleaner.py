"""The cleaner's pieces over real files: a swap interrupted on either side of its commit point,
transactions (aborted records go, markers stay while their records do), compact-only topics
kept from retention, and the topic configs."""
from __future__ import annotations

import os

import pytest
from test_compaction_stateful import read_all
from test_partition import crash_log

from oncelog.core.compaction import DELETE_HORIZON_FLAG
from oncelog.core.producer_state import ProducerStateConfig
from oncelog.core.topic_config import alter_list, effective_topic_config, parse_topic_configs
from oncelog.protocol.errors import KafkaProtocolError
from oncelog.protocol.records import Record, encode_batch
from oncelog.storage import cleaner
from oncelog.storage import producer_snapshots as snaps
from oncelog.storage.log import LogConfig
from oncelog.storage.partition import Partition, PartitionConfig
from oncelog.storage.segment import CLEANED, SWAP, swap_names

T0 = 1_700_000_000_000


def config(**log) -> PartitionConfig:
    log = {"segment_bytes": 300, "cleanup_policy": "compact", "min_cleanable_dirty_ratio": 0.0,
           "delete_retention_ms": 1000, **log}
    return PartitionConfig(LogConfig(**log), ProducerStateConfig())


def put(p: Partition, key: bytes, value: bytes | None, now: int = T0, **producer) -> int:
    r = p.append_from_client(bytearray(encode_batch([Record(0, now, key, value, ())], **producer)), now)
    assert r.error_code == 0, r
    p.log.flush()
    return r.base_offset


def filled(tmp_path, n: int = 30) -> Partition:
    p = Partition.open("t", 0, tmp_path / "t-0", config(), T0)
    for i in range(n):
        put(p, b"k%d" % (i % 3), b"v%d" % i)
    return p


@pytest.mark.parametrize("committed", [False, True])
def test_a_swap_interrupted_by_a_crash_is_discarded_or_finished(tmp_path, committed):
    p = filled(tmp_path)
    before = read_all(p)
    job = cleaner.prepare(p, T0)
    cleaner.run(job)
    assert job.error is None and job.cleaned
    directory = p.directory
    base = job.cleaned[0].old.base_offset
    log_cleaned, txn_cleaned = swap_names(directory, base, CLEANED)
    log_swap, txn_swap = swap_names(directory, base, SWAP)
    os.replace(txn_cleaned, txn_swap)
    if committed:
        os.replace(log_cleaned, log_swap)  # the commit point, then the crash
    crash_log(p.log)
    p = Partition.open("t", 0, directory, config(), T0 + 1)
    after = read_all(p)
    assert not list(directory.glob(f"*{CLEANED}")) and not list(directory.glob(f"*{SWAP}"))
    if committed:
        assert len(after) < len(before)
        assert {o: (k, v) for o, k, v, _ in after}.items() <= {o: (k, v) for o, k, v, _ in before}.items()
    else:
        assert after == before
    cleaner.clean_now(p, T0 + 2)
    latest = {k: v for _o, k, v, _ in before}
    assert {k: v for _o, k, v, _ in read_all(p)} == latest
    p.close()


def test_aborted_records_go_and_markers_stay_while_their_records_do(tmp_path):
    p = Partition.open("t", 0, tmp_path / "t-0", config(delete_retention_ms=100), T0)
    txn = {"producer_id": 5, "producer_epoch": 0, "transactional": True}
    put(p, b"a", b"committed-a")
    put(p, b"a", b"aborted-1", base_sequence=0, **txn)
    put(p, b"b", b"aborted-2", base_sequence=1, **txn)
    abort_at = p.append_marker(5, 0, 0, False, T0)
    put(p, b"c", b"committed", base_sequence=2, **txn)
    commit_at = p.append_marker(5, 0, 0, True, T0)
    for i in range(12):
        put(p, b"x%d" % i, b"filler")
    cleaner.clean_now(p, T0 + 10)
    values = [v for _o, _k, v, _ in read_all(p)]
    assert b"aborted-1" not in values and b"aborted-2" not in values and b"committed" in values
    assert b"committed-a" in values  # an aborted write of its key does not supersede it
    markers = [h for h in p.log.iter_batches_from(0) if h.is_control]
    # the ABORT marker's transaction had records this pass: it stays; the COMMIT's records stay
    assert [h.base_offset for h in markers] == [abort_at, commit_at]
    assert all(h.attributes & DELETE_HORIZON_FLAG == 0 for h in markers)
    # the next pass finds no record of the aborted transaction: its marker gets a horizon,
    # and goes at the first pass after it
    for i in range(12):
        put(p, b"y%d" % i, b"filler")
    cleaner.clean_now(p, T0 + 20)
    abort = [h for h in p.log.iter_batches_from(0) if h.base_offset == abort_at][0]
    assert abort.attributes & DELETE_HORIZON_FLAG and abort.base_timestamp == T0 + 20 + 100
    for i in range(12):
        put(p, b"z%d" % i, b"filler")
    cleaner.clean_now(p, T0 + 200)
    left = {h.base_offset: h.records_count for h in p.log.iter_batches_from(0) if h.is_control}
    assert left.get(abort_at, 0) == 0  # gone, or emptied if it were the producer's latest entry
    assert p.last_stable_offset == p.high_watermark
    p.close()


def test_compact_only_topics_are_not_deleted_by_retention(tmp_path):
    p = filled(tmp_path)
    p.log.config = config(retention_ms=1).log
    assert p.log.enforce_retention(T0 + 10**9) == 0
    p.log.config = config(retention_ms=1, cleanup_policy="compact,delete").log
    assert p.log.enforce_retention(T0 + 10**9) > 0
    p.close()


def test_cleanup_policy_is_a_list_config_and_compaction_configs_validate():
    assert effective_topic_config({}, {})["cleanup.policy"] == "delete"
    assert parse_topic_configs({"cleanup.policy": "compact, delete"})["cleanup.policy"] == "compact,delete"
    assert parse_topic_configs({"min.cleanable.dirty.ratio": "0.1"})["min.cleanable.dirty.ratio"] == 0.1
    for bad in ({"cleanup.policy": "shred"}, {"cleanup.policy": ""}, {"min.cleanable.dirty.ratio": "1.5"},
                {"delete.retention.ms": "-2"}, {"max.compaction.lag.ms": "0"}, {"min.compaction.lag.ms": "-1"}):
        with pytest.raises(KafkaProtocolError):
            parse_topic_configs(bad)
    assert alter_list("delete", "compact", append=True) == "delete,compact"
    assert alter_list("delete,compact", "compact", append=True) == "delete,compact"
    assert alter_list("delete,compact", "delete", append=False) == "compact"


def test_an_aborted_transaction_below_the_dirty_range_does_not_hide_a_later_one(tmp_path):
    """Pass 1 cleans an aborted transaction of producer 5 (its marker stays: its records were
    there); producer 5's next transaction commits `k`. Pass 2's offset map must take that
    record: the older value of `k` goes."""
    p = Partition.open("t", 0, tmp_path / "t-0", config(), T0)
    txn = {"producer_id": 5, "producer_epoch": 0, "transactional": True}
    put(p, b"k", b"old")
    put(p, b"a", b"aborted", base_sequence=0, **txn)
    p.append_marker(5, 0, 0, False, T0)
    for i in range(8):
        put(p, b"x%d" % i, b"filler")
    cleaner.clean_now(p, T0 + 1)
    put(p, b"k", b"new", base_sequence=1, **txn)
    p.append_marker(5, 0, 0, True, T0)
    for i in range(8):
        put(p, b"y%d" % i, b"filler")
    cleaner.clean_now(p, T0 + 2)
    assert [v for _o, k, v, _ in read_all(p) if k == b"k"] == [b"new"]
    p.close()


def test_a_commit_marker_stays_while_its_records_do_even_past_its_horizon(tmp_path):
    """Else a rebuild from the log would meet the transaction's records without their marker,
    take the transaction for open and hold the last stable offset back for good."""
    p = Partition.open("t", 0, tmp_path / "t-0", config(delete_retention_ms=10), T0)
    put(p, b"k", b"committed", producer_id=5, producer_epoch=0, base_sequence=0, transactional=True)
    commit_at = p.append_marker(5, 0, 0, True, T0)
    for i in range(10):
        put(p, b"x%d" % i, b"filler")
    for t in (T0 + 1, T0 + 1000, T0 + 2000):
        for i in range(10):
            put(p, b"y%d" % i, b"filler", now=t)
        cleaner.clean_now(p, t)
    assert [h.base_offset for h in p.log.iter_batches_from(0) if h.is_control] == [commit_at]
    p.close()
    snaps.delete_snapshots(path for _off, path in snaps.list_snapshots(tmp_path / "t-0"))
    p = Partition.open("t", 0, tmp_path / "t-0", config(delete_retention_ms=10), T0 + 3000)
    assert p.last_stable_offset == p.high_watermark
    assert [v for _o, k, v, _ in read_all(p) if k == b"k"] == [b"committed"]
    p.close()


def test_a_tombstone_past_its_horizon_goes_when_the_dirty_range_holds_only_an_aborted_transaction(tmp_path):
    """The map of pass 2 holds no key (aborted records are left out of it), yet it covers the
    dirty range: the tombstone below it, past its horizon, goes (Kafka's buildOffsetMap advances
    the map's latest offset over every batch it reads, markers and aborted ones included)."""
    p = Partition.open("t", 0, tmp_path / "t-0", config(segment_bytes=1 << 20), T0)
    txn = {"producer_id": 5, "producer_epoch": 0, "transactional": True}
    tombstone_at = put(p, b"a", None)
    put(p, b"a", b"aborted-1", base_sequence=0, **txn)
    p.append_marker(5, 0, 0, False, T0)
    p.log.roll(T0)
    cleaner.clean_now(p, T0 + 1)
    first = next(h for h in p.log.iter_batches_from(0) if h.base_offset == tombstone_at)
    assert first.attributes & DELETE_HORIZON_FLAG and first.base_timestamp == T0 + 1 + 1000
    put(p, b"a", b"aborted-2", base_sequence=1, **txn)
    p.append_marker(5, 0, 0, False, T0)
    p.log.roll(T0)
    assert cleaner.clean_now(p, T0 + 1001) > 0
    assert [(o, k, v) for o, k, v, _ in read_all(p)] == []
    assert p.last_stable_offset == p.high_watermark
    p.close()


def test_an_emptied_batch_goes_once_no_longer_its_producers_last_and_its_marker_after_it(tmp_path):
    """Pass 1 empties producer 5's aborted batch and keeps it (its last batch). Once producer 5
    has written another batch, the empty one goes even though nothing else of its segment
    changes (Kafka: DELETE_EMPTY keeps no empty batch it need not), and its ABORT marker then
    follows the tombstone rule: a horizon at the next pass, gone at the first pass after it."""
    p = Partition.open("t", 0, tmp_path / "t-0", config(segment_bytes=1 << 20, delete_retention_ms=100), T0)
    txn = {"producer_id": 5, "producer_epoch": 0, "transactional": True}
    put(p, b"k", b"v")
    aborted_at = put(p, b"a", b"aborted", base_sequence=0, **txn)
    abort_at = p.append_marker(5, 0, 0, False, T0)
    p.log.roll(T0)

    def batches() -> dict[int, tuple[int, bool]]:
        return {h.base_offset: (h.records_count, bool(h.attributes & DELETE_HORIZON_FLAG))
                for h in p.log.iter_batches_from(0)}

    cleaner.clean_now(p, T0 + 1)
    assert batches()[aborted_at] == (0, False)
    put(p, b"c", b"committed", base_sequence=1, **txn)
    p.append_marker(5, 0, 0, True, T0)
    p.log.roll(T0)
    cleaner.clean_now(p, T0 + 2)
    assert aborted_at not in batches() and batches()[abort_at] == (1, False)
    for t in (T0 + 3, T0 + 200):
        put(p, b"x%d" % (t - T0), b"filler")
        p.log.roll(t)
        cleaner.clean_now(p, t)
        assert batches().get(abort_at) == ((1, True) if t == T0 + 3 else None)
    assert [(k, v) for _o, k, v, _ in read_all(p)] == [(b"k", b"v"), (b"c", b"committed"),
                                                      (b"x3", b"filler"), (b"x200", b"filler")]
    p.close()
    snaps.delete_snapshots(path for _off, path in snaps.list_snapshots(tmp_path / "t-0"))
    p = Partition.open("t", 0, tmp_path / "t-0", config(segment_bytes=1 << 20, delete_retention_ms=100), T0 + 300)
    assert p.last_stable_offset == p.high_watermark
    p.close()
