"""Review of i13-pstate (remembered expired producers, producer cap): scenarios over a real
PartitionLog in a temp directory, as tests/storage/test_partition.py."""
from __future__ import annotations

from test_partition import NOW, PID, PreadBytes, batch, env, fill  # noqa: F401 - env is a fixture

from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.records import Record, encode_batch


# review1: Partition._restore_from_log read every byte between an expired producer's oldest and
# newest retained batch (up to expired.lookup.offsets offsets of other producers' data), on the
# event loop, for one Produce request. Now each remembered batch's header is read through the index.
def test_review_restoring_an_expired_producer_reads_its_batches_not_the_data_between(env, monkeypatch):
    # A slow producer among busy ones: its window (offsets 0, 302..308) spans 300 batches of
    # 20 KB written by others. Its next batch after expiry restores it.
    e = env(producer_id_expiration_ms=1000)
    fill(e, 1)
    big = bytearray(encode_batch([Record(0, NOW, None, b"x" * 20_000, [])]))
    for _ in range(300):
        assert e.append(big).error_code == 0
    fill(e, 4, start=2)
    e.partition.remove_expired_producers(NOW + 5000)
    reads = PreadBytes(monkeypatch)
    r = e.append(batch(10), now=NOW + 5000)
    assert r.error_code == 0
    # its own 5 batches are a few hundred bytes; the index interval is 4 KB: a bounded read
    # would be tens of KB, whatever the other producers wrote in between (here 6 MB)
    assert reads.total < 200_000, reads.total


# review1: at producer.state.max.producers.per.partition a new producer was refused until an idle
# one reached producer.id.expiration.ms (24 h by default): one client with forged ids locked every
# new idempotent producer out. Now the least recently updated producer is evicted into the
# remembered set and restored from the log like an expired one.
def test_review_a_full_partition_does_not_lock_out_new_producers_until_expiry(env):
    cap, expiry = 50, 86_400_000
    e = env(producer_state_max_producers_per_partition=cap, producer_id_expiration_ms=expiry)
    for pid in range(10_000, 10_000 + cap):     # a hostile client: one tiny batch per forged id
        assert e.append(batch(0, 1, pid=pid)).error_code == 0
    # an hour later a real producer starts: refused, and retried until its delivery timeout
    r = e.append(batch(0, pid=PID), now=NOW + 3_600_000)
    assert r.error_code != E.THROTTLING_QUOTA_EXCEEDED


# review1: ExpiredProducers.shed forgot the producers with the oldest newest batch while their
# batches were still in the log; an idle producer shed that way got UNKNOWN_PRODUCER_ID with log
# start <= its last acknowledged offset, which its client must report as data loss (issue 13 item
# 2's false DataLossError, back under producer churn: a Spark sink opens a producer id per task per
# micro-batch). Now the forgotten leave a watermark, the producer-state start offset, and an
# UNKNOWN_PRODUCER_ID answer carries a log start offset above it.
def test_review_producer_churn_does_not_bring_back_false_data_loss(env):
    # the remembered set's budget (producer.state.max.remembered.producers.per.partition,
    # default 100,000) made small: the same policy at a scale a test can reach
    e = env(producer_id_expiration_ms=1000, producer_state_max_remembered_producers_per_partition=10)
    offsets = fill(e, 3, pid=1)              # an idle producer: offsets 0..5, last ack 5
    last_acked = offsets[-1] + 1
    now = NOW
    for wave in range(3):                    # short-lived producers, one id each, expiring
        for pid in range(1000 + 10 * wave, 1010 + 10 * wave):
            assert e.append(batch(0, 1, pid=pid), now=now).error_code == 0
        now += 5000
        e.partition.remove_expired_producers(now)
    r = e.append(batch(6, pid=1), now=now)
    # what its client sees must not be UNKNOWN_PRODUCER_ID with log start 0 <= last acknowledged
    # 5 (DataLossError): either the batch is appended, or the answer says its state was lost
    # (log start above its last acknowledged offset: its client resets and continues). With the
    # producer forgotten for room it is the second; it cannot be the first without a read of the
    # log for ids the broker does not know.
    appended = r.error_code == 0 and r.base_offset == e.end - 2
    state_lost = r.error_code == E.UNKNOWN_PRODUCER_ID and r.log_start_offset > last_acked
    assert appended or state_lost, (r.error_code, r.log_start_offset, offsets)
    r = e.append(batch(0, pid=1, epoch=1), now=now)   # the client's reset: a new epoch at sequence 0
    assert r.error_code == 0 and r.base_offset == e.end - 2
