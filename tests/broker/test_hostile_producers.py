"""Issue 13, item 3, from outside: one client sending what costs the broker most must get correct
answers for every request, from a real broker process over real sockets, on a 20,000-batch log.
(What each costs in CPU is measured by bench/hostile_producers.py; tests do not assert timings.
The bounds themselves are shown by tests/core/test_producer_state.py (probe lengths of chosen
ids) and tests/storage/test_partition.py (no log read for a never-seen id).)"""
from __future__ import annotations

from oncelog.client import AdminClient
from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing.hostile import colliding_producer_ids, idempotent_batch, plain_batches, produce

LOG_BATCHES = 20_000


def _fill(bootstrap: str, topic: str) -> int:
    answers = produce(bootstrap, topic, [plain_batches(500)] * (LOG_BATCHES // 500))
    assert all(a.error_code == 0 for a in answers)
    return LOG_BATCHES


def _log_end(bootstrap: str, topic: str) -> int:
    (a,) = produce(bootstrap, topic, [plain_batches(1)])
    return a.base_offset


def test_never_seen_producers_and_colliding_ids_are_each_answered_correctly(broker):
    topic = "hostile"
    with AdminClient({"bootstrap.servers": broker.bootstrap}) as admin:
        admin.create_topics([topic])[topic].result()
    end = _fill(broker.bootstrap, topic)

    # 10,000 producer ids the broker never saw, at sequence 1: UNKNOWN_PRODUCER_ID with the log
    # start offset (the client compares it with its last acknowledged offset), nothing appended
    strangers = range(10**12, 10**12 + 10_000)
    answers = produce(broker.bootstrap, topic, (idempotent_batch(pid, 1) for pid in strangers))
    assert len(answers) == 10_000
    assert {(a.error_code, a.base_offset, a.log_start_offset) for a in answers} == {(E.UNKNOWN_PRODUCER_ID, -1, 0)}
    assert _log_end(broker.bootstrap, topic) == end
    end += 1

    # 8,000 ids that all shared one slot of the old public hash: each a new producer, appended once
    ids = colliding_producer_ids(8000)
    answers = produce(broker.bootstrap, topic, (idempotent_batch(pid, 0) for pid in ids))
    assert [(a.error_code, a.base_offset) for a in answers] == [(0, end + i) for i in range(8000)]
    # their retries are duplicates answered with the original offsets, and they continue in sequence
    retries = produce(broker.bootstrap, topic, (idempotent_batch(pid, 0) for pid in ids))
    assert [(a.error_code, a.base_offset) for a in retries] == [(0, end + i) for i in range(8000)]
    nexts = produce(broker.bootstrap, topic, (idempotent_batch(pid, 1) for pid in ids[::8]))
    assert [(a.error_code, a.base_offset) for a in nexts] == [(0, end + 8000 + i) for i in range(1000)]


def test_producers_beyond_the_cap_evict_the_least_recently_updated_and_keep_deduplication(broker):
    # One client with 1,500 ids on a partition capped at 1,000: nobody is locked out (the least
    # recently updated producer is evicted into the remembered set), and every producer's retry,
    # evicted or not, is still answered with its original offset (restored from the log).
    topic = "capped"
    with AdminClient({"bootstrap.servers": broker.bootstrap}) as admin:
        admin.create_topics([topic], config={"producer.state.max.producers.per.partition": "1000"})[topic].result()
    ids = colliding_producer_ids(1500)
    answers = produce(broker.bootstrap, topic, (idempotent_batch(pid, 0) for pid in ids))
    assert [(a.error_code, a.base_offset) for a in answers] == [(0, i) for i in range(1500)]
    retries = produce(broker.bootstrap, topic, (idempotent_batch(pid, 0) for pid in ids))
    assert [(a.error_code, a.base_offset) for a in retries] == [(0, i) for i in range(1500)]
    assert _log_end(broker.bootstrap, topic) == 1500
    nexts = produce(broker.bootstrap, topic, (idempotent_batch(pid, 1) for pid in ids[::10]))
    assert [(a.error_code, a.base_offset) for a in nexts] == [(0, 1501 + i) for i in range(150)]
    with AdminClient({"bootstrap.servers": broker.bootstrap}) as admin:
        assert len(admin.describe_producers(topic, 0)) == 1000
