"""The sans-IO producer core against a model broker: KIP-1269 in-flight policy, KAFKA-5494 ordering
under errors, KIP-360 epoch bumps, UNKNOWN_PRODUCER_ID handling, DUPLICATE_SEQUENCE_NUMBER, modes."""
import logging

import pytest
from core_harness import Harness
from model_broker import ModelPartition

from oncelog.client.config import Idempotence, ProducerConfig
from oncelog.client.errors import AuthorizationError, ConfigError, DataLossError, IdempotenceUnsupportedError
from oncelog.client.producer_core import PartitionResult, ProducerCore
from oncelog.client.types import TopicPartition
from oncelog.protocol.errors import ErrorCode as E

T0 = TopicPartition("t", 0)


def many(n=60):
    """max.in.flight high enough that only the per-partition window limits."""
    return {"max.in.flight.requests.per.connection": n, "batch.size": 1}


def fill(h, tp, batches):
    """One record per batch (batch.size is tiny), so batches == records."""
    return [h.produce(tp, 1)[0] for _ in range(batches)]


def warm(h, tp=T0):
    """First batch of the epoch acknowledged: from then on the window applies (before that, one
    batch at a time; see test_first_batch_of_an_epoch_goes_alone)."""
    out = fill(h, tp, 1)
    h.run_until_idle()
    return out


def assert_log_is(h, tp, cookies):
    assert h.models[tp].log == cookies, (h.models[tp].log, cookies)


# ------------------------------------------------------------------ KIP-1269 in-flight policy

def test_window_starts_at_5_then_learned_from_response():
    h = Harness(many(), t_0=ModelPartition(window=20, report_window=False))
    warm(h)
    h.models[T0].report_window = True
    fill(h, T0, 40)
    first = h.send()
    assert len(first) == 5                     # 5 until the leader tells us more
    h.process(first[0])
    h.deliver(first[0])
    assert h.core.partition_state(T0).window == 20
    more = h.send()
    assert len(more) == 16                     # 4 still out + 16 = 20
    assert h.core.partition_state(T0).in_flight == 20


def test_window_reset_to_5_on_leader_change_and_rediscovered():
    h = Harness(many(), t_0=ModelPartition(window=20))
    fill(h, T0, 10)
    h.run_until_idle()
    assert h.core.partition_state(T0).window == 20
    # leader moves to an old broker that keeps 5 and does not send the field
    h.models[T0].window, h.models[T0].report_window = 5, False
    h.core.update_leader(T0, 2, 1)
    assert h.core.partition_state(T0).window == 5
    fill(h, T0, 30)
    reqs = h.send(2)
    assert len(reqs) == 5
    for r in reqs:
        h.process(r)
        h.deliver(r)
    assert h.core.partition_state(T0).window == 5  # absent field keeps 5
    # the leader comes back to a new broker: rediscovered from its first answer
    h.models[T0].window, h.models[T0].report_window = 20, True
    h.core.update_leader(T0, 1, 2)
    r = h.send(1)
    assert len(r) == 5
    h.process(r[0])
    h.deliver(r[0])
    assert h.core.partition_state(T0).window == 20


def test_leader_epoch_change_on_same_node_also_resets():
    h = Harness(many(), t_0=ModelPartition(window=20))
    fill(h, T0, 3)
    h.run_until_idle()
    h.core.update_leader(T0, 1, 5)
    assert h.core.partition_state(T0).window == 5


def test_two_topics_on_one_broker_keep_their_own_windows():
    a, b = TopicPartition("a", 0), TopicPartition("b", 0)
    h = Harness(many(60))
    h.add_partition(a, ModelPartition(window=5))
    h.add_partition(b, ModelPartition(window=20))
    fill(h, a, 1)
    fill(h, b, 1)
    h.run_until_idle()
    fill(h, a, 40)
    fill(h, b, 40)
    h.send()
    assert h.core.partition_state(a).in_flight == 5
    assert h.core.partition_state(b).in_flight == 20


def test_connection_limit_1_bounds_a_partition_with_window_20():
    h = Harness({"max.in.flight.requests.per.connection": 1, "batch.size": 1},
                t_0=ModelPartition(window=20))
    fill(h, T0, 10)
    h.run_until_idle()
    fill(h, T0, 10)
    assert len(h.send()) == 1
    assert h.core.partition_state(T0).in_flight == 1


def test_connection_limit_20_with_window_5():
    h = Harness(many(20), t_0=ModelPartition(window=5))
    warm(h)
    fill(h, T0, 30)
    h.send()
    assert h.core.partition_state(T0).in_flight == 5
    h.run_until_idle()
    assert h.core.partition_state(T0).max_in_flight_seen == 5


def test_old_broker_without_field_stays_at_5():
    h = Harness(many(), t_0=ModelPartition(window=20, report_window=False))
    cookies = fill(h, T0, 50)
    h.run_until_idle()
    assert h.core.partition_state(T0).max_in_flight_seen == 5
    assert_log_is(h, T0, cookies)


@pytest.mark.parametrize("n", [6, 20, 100, 1000])
def test_no_config_error_above_5_with_idempotence(n):
    cfg = ProducerConfig.from_dict({"bootstrap.servers": "x", "enable.idempotence": "true",
                                    "max.in.flight.requests.per.connection": n})
    assert cfg.max_in_flight == n and cfg.idempotence is Idempotence.REQUIRED


def test_config_rejects_nonsense():
    with pytest.raises(ConfigError):
        ProducerConfig.from_dict({"bootstrap.servers": "x", "enable.idempotence": "maybe"})
    with pytest.raises(ConfigError):
        ProducerConfig.from_dict({"bootstrap.servers": "x", "acks": "0", "enable.idempotence": "required"})
    with pytest.raises(ConfigError):
        ProducerConfig.from_dict({"bootstrap.servers": "x", "max.in.flight.requests.per.connection": 0})


# ------------------------------------------------------------------ sequences and ordering (KAFKA-5494)

def test_sequence_assigned_at_drain_not_append():
    h = Harness(many(), t_0=ModelPartition())
    warm(h)
    fill(h, T0, 3)
    assert all(b.base_sequence == -1 for b in h.core.acc.queues[T0])
    reqs = h.send()
    assert [r.batches[0].base_sequence for r in reqs] == [1, 2, 3]


def test_retriable_error_on_first_keeps_sequences_and_order():
    h = Harness(many(), t_0=ModelPartition())
    cookies = fill(h, T0, 1)
    h.run_until_idle()
    cookies += fill(h, T0, 5)
    reqs = h.send()
    h.error(reqs[0], E.NOT_LEADER_OR_FOLLOWER)
    for r in reqs[1:]:
        h.process(r)                       # the broker answers OutOfOrderSequence: gap at seq 0
    assert all(r.results[0].error_code == E.OUT_OF_ORDER_SEQUENCE_NUMBER for r in reqs[1:])
    for r in reversed(reqs):               # responses in any order
        h.deliver(r)
    assert not h.core.bump_requested       # knock-on errors, not a gap after the last ack
    seqs = [b.base_sequence for b in h.core.acc.queues[T0]]
    assert seqs == [1, 2, 3, 4, 5]         # re-queued in sequence order, sequences kept
    # recovering: only the head-of-line batch goes, alone
    r = h.send()
    assert len(r) == 1 and r[0].batches[0].base_sequence == 1
    h.process(r[0])
    h.deliver(r[0])
    h.run_until_idle()
    assert_log_is(h, T0, cookies)
    assert all(h.results[c][0] == i for i, c in enumerate(cookies))


def test_lost_response_retry_is_deduplicated_with_original_offset():
    h = Harness(many(), t_0=ModelPartition())
    cookies = warm(h) + fill(h, T0, 5)
    reqs = h.send()
    for r in reqs:
        h.process(r)
    h.lose(reqs[1])                        # written, but the answer never came
    for r in (reqs[0], reqs[2], reqs[3], reqs[4]):
        h.deliver(r)
    h.run_until_idle()
    assert_log_is(h, T0, cookies)
    assert h.results[cookies[2]] == (2, None)


def test_new_batches_wait_while_partition_recovers():
    h = Harness(many(), t_0=ModelPartition())
    warm(h)
    fill(h, T0, 3)
    reqs = h.send()
    h.error(reqs[0], E.REQUEST_TIMED_OUT)
    h.deliver(reqs[0])
    fill(h, T0, 3)
    assert h.send() == []                  # 2 still in flight: the retry waits, new ones too
    for r in reqs[1:]:
        h.process(r)
        h.deliver(r)
    r = h.send()
    assert [x.batches[0].base_sequence for x in r] == [1]


def test_first_batch_of_an_epoch_goes_alone():
    """A broker without state for a producer accepts any first sequence (Kafka does): if batch 0
    failed with a retriable error while batch 1 was in flight, 1 would land before 0."""
    h = Harness(many(), t_0=ModelPartition())
    cookies = fill(h, T0, 4)
    reqs = h.send()
    assert len(reqs) == 1
    h.error(reqs[0], E.NOT_ENOUGH_REPLICAS)
    h.deliver(reqs[0])
    assert len(h.send()) == 1                  # still alone: nothing acknowledged yet
    h.run_until_idle()
    assert_log_is(h, T0, cookies)


def test_duplicate_sequence_number_is_success_with_offset_none():
    h = Harness(many(), t_0=ModelPartition())
    c = fill(h, T0, 1)
    r = h.send()[0]
    r.results = [PartitionResult(error_code=E.DUPLICATE_SEQUENCE_NUMBER)]
    h.deliver(r)
    assert h.results[c[0]] == (None, None)


# ------------------------------------------------------------------ KIP-360

def test_out_of_order_after_last_acked_bumps_epoch_and_renumbers():
    h = Harness(many(), t_0=ModelPartition())
    first = fill(h, T0, 3)
    h.run_until_idle()
    h.models[T0].lose_tail(1)               # the broker lost acknowledged record 2 (acks=1 leader loss)
    later = fill(h, T0, 3)
    reqs = h.send()
    for r in reqs:
        h.process(r)
    assert reqs[0].results[0].error_code == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    for r in reqs:
        h.deliver(r)
    assert h.core.bump_requested
    pid = h.core.producer_id
    assert h.core.producer_id_request() is None       # bumped locally: no InitProducerId
    assert (h.core.producer_id, h.core.producer_epoch) == (pid, 1) and not h.core.bump_requested
    reqs = h.send()
    assert [r.batches[0].base_sequence for r in reqs] == [0]    # renumbered; alone until acked
    assert reqs[0].batches[0].producer_epoch == 1
    h.run_until_idle()
    seqs = sorted(b.base_sequence for b in h.core.acc.queues[T0])
    assert seqs == []
    assert h.models[T0].log == first[:2] + later
    assert all(h.results[c][1] is None for c in later)


def test_bump_only_renumbers_the_failed_partition_others_switch_lazily():
    a, b = TopicPartition("a", 0), TopicPartition("b", 0)
    h = Harness(many())
    h.add_partition(a, ModelPartition())
    h.add_partition(b, ModelPartition())
    fill(h, a, 2)
    fill(h, b, 2)
    h.run_until_idle()
    h.models[a].lose_tail(1)
    fill(h, a, 1)
    fill(h, b, 1)
    reqs = h.send()
    for r in reqs:
        h.process(r)
        h.deliver(r)
    h.run_until_idle()
    assert h.core.producer_epoch == 1
    assert len(h.models[b].log) == 3 and len(h.models[a].log) == 2


def test_fatal_batch_failure_leaves_no_gap():
    h = Harness(many(), t_0=ModelPartition())
    cookies = warm(h) + fill(h, T0, 4)
    reqs = h.send()
    h.error(reqs[1], E.INVALID_RECORD)      # non-retriable: batch 1 fails for good
    for r in (reqs[0], reqs[2], reqs[3]):
        h.process(r)
    for r in reqs:
        h.deliver(r)
    h.run_until_idle()
    assert h.results[cookies[2]][1] is not None
    assert_log_is(h, T0, [cookies[0], cookies[1], cookies[3], cookies[4]])
    assert h.core.producer_epoch == 1


# ------------------------------------------------------------------ UNKNOWN_PRODUCER_ID

def test_unknown_producer_after_retention_resets_and_retries():
    h = Harness(many(), t_0=ModelPartition())
    fill(h, T0, 3)
    h.run_until_idle()
    m = h.models[T0]
    m.delete_before(3)                      # retention removed everything we wrote
    m.expire_producers()
    cookies = fill(h, T0, 2)
    h.run_until_idle()
    assert m.log == cookies
    assert all(h.results[c] == (3 + i, None) for i, c in enumerate(cookies))
    assert h.core.fatal is None


def test_unknown_producer_without_retention_is_fatal_data_loss():
    h = Harness(many(), t_0=ModelPartition())
    fill(h, T0, 3)
    h.run_until_idle()
    h.models[T0].expire_producers()         # state gone but the records are still there
    cookies = fill(h, T0, 2)
    h.run_until_idle()
    err = h.core.fatal
    assert isinstance(err, DataLossError)
    assert "t-0" in str(err) and "log start offset 0" in str(err) and "offset 2" in str(err)
    assert all(isinstance(h.results[c][1], DataLossError) for c in cookies)
    with pytest.raises(DataLossError):
        h.produce(T0, 1)


# ------------------------------------------------------------------ range mode (KIP-758)

def test_range_mode_bounds_in_flight_sequences_not_batches():
    h = Harness(many(200), t_0=ModelPartition(range_threshold=30))
    fill(h, T0, 1)
    h.run_until_idle()
    assert h.core.partition_state(T0).max_inflight_sequences == 30
    fill(h, T0, 100)
    h.send()
    ps = h.core.partition_state(T0)
    assert ps.in_flight == 30 and ps.unacked_records == 30
    h.run_until_idle()
    assert len(h.models[T0].log) == 101


def test_range_mode_duplicate_is_delivered_with_offset_none():
    h = Harness(many(), t_0=ModelPartition(range_threshold=100))
    fill(h, T0, 1)
    h.run_until_idle()
    cookies = fill(h, T0, 3)
    reqs = h.send()
    for r in reqs:
        h.process(r)
    h.lose(reqs[0])
    for r in reqs[1:]:
        h.deliver(r)
    h.run_until_idle()
    assert h.results[cookies[0]] == (None, None)   # older than the latest batch: DUPLICATE_SEQUENCE_NUMBER
    assert len(h.models[T0].log) == 4


# ------------------------------------------------------------------ idempotence modes

def test_off_mode_sends_no_producer_id():
    h = Harness({"enable.idempotence": "off", **many()}, t_0=ModelPartition())
    fill(h, T0, 2)
    reqs = h.send()
    assert all(r.batches[0].producer_id == -1 and r.batches[0].base_sequence == -1 for r in reqs)
    assert h.core.producer_id_request() is None


def test_requested_falls_back_with_warning_for_broker_without_idempotence(caplog):
    cfg = ProducerConfig.from_dict({"bootstrap.servers": "x", "enable.idempotence": "requested"})
    with caplog.at_level(logging.WARNING):
        core = ProducerCore(cfg, idempotence_available=False)
    assert not core.idempotent and core.fatal is None
    assert "without" in caplog.text


def test_required_fails_clearly_for_broker_without_idempotence():
    cfg = ProducerConfig.from_dict({"bootstrap.servers": "x", "enable.idempotence": "required"})
    core = ProducerCore(cfg, idempotence_available=False)
    assert isinstance(core.fatal, IdempotenceUnsupportedError)
    assert "enable.idempotence=required" in str(core.fatal)


def test_requested_old_format_topic_goes_plain_other_topics_stay_idempotent(caplog):
    old, new = TopicPartition("old", 0), TopicPartition("new", 0)
    h = Harness({"enable.idempotence": "requested", **many()})
    h.add_partition(old, ModelPartition())
    h.add_partition(new, ModelPartition())
    with caplog.at_level(logging.WARNING):
        h.core.topic_message_format("old", False, "0.10.2")
    assert "old" in caplog.text
    fill(h, old, 1)
    fill(h, new, 1)
    reqs = h.send()
    by_tp = {b.tp: b for r in reqs for b in r.batches}
    assert by_tp[old].producer_id == -1 and by_tp[new].producer_id >= 0


def test_required_old_format_topic_fails_that_topic_only():
    old, new = TopicPartition("old", 0), TopicPartition("new", 0)
    h = Harness({"enable.idempotence": "required", **many()})
    h.add_partition(old, ModelPartition())
    h.add_partition(new, ModelPartition())
    c = fill(h, old, 1)
    h.core.topic_message_format("old", False, "0.10.2")
    h.collect()
    assert isinstance(h.results[c[0]][1], IdempotenceUnsupportedError)
    with pytest.raises(IdempotenceUnsupportedError, match="old"):
        h.produce(old, 1)
    ok = fill(h, new, 1)
    h.run_until_idle()
    assert h.results[ok[0]] == (0, None)


def test_unsupported_for_message_format_answer_falls_back_in_requested_mode():
    h = Harness({"enable.idempotence": "requested", **many()}, t_0=ModelPartition())
    cookies = fill(h, T0, 1)
    r = h.send()[0]
    h.error(r, E.UNSUPPORTED_FOR_MESSAGE_FORMAT)
    h.deliver(r)
    h.run_until_idle()
    assert h.results[cookies[0]] == (0, None)
    assert h.models[T0].log == cookies and not h.core.partition_state(T0).idempotent


def test_bump_at_max_epoch_asks_for_a_fresh_producer_id():
    h = Harness(many(), t_0=ModelPartition())
    warm(h)
    h.core.producer_epoch = 32767
    h.core.bump_requested = True
    assert h.core.producer_id_request() == (-1, -1)


def test_out_of_order_on_a_later_batch_retries_without_bump():
    h = Harness(many(), t_0=ModelPartition())
    warm(h)
    fill(h, T0, 3)
    reqs = h.send()
    h.error(reqs[0], E.NOT_LEADER_OR_FOLLOWER)
    for r in reqs[1:]:
        h.process(r)
    for r in reqs:
        h.deliver(r)
    assert not h.core.bump_requested and h.core.producer_epoch == 0


# ------------------------------------------------------------------ issue 14: range mode across a leader change

def records_of(h, tp, n, size=10):
    """One batch of n records (the batch is closed by the next append or by the drain)."""
    out = []
    for _ in range(n):
        c = h.next_cookie
        h.next_cookie += 1
        assert h.core.append(tp, h.now, None, b"x" * size, None, c, h.now) is not None
        out.append(c)
    return out


def test_range_threshold_is_kept_across_a_leader_change():
    """Threshold 10; five batches of 4 records to a new leader with their answers lost: the
    oldest would fall outside the broker's range (OutOfOrderSequence, bump, 20 duplicates).
    Until the new leader answers, both the last threshold and 5 batches apply."""
    from oncelog.protocol.records import BATCH_OVERHEAD, RECORD_OVERHEAD
    four = BATCH_OVERHEAD + 4 * (RECORD_OVERHEAD + 10)
    h = Harness({"max.in.flight.requests.per.connection": 60, "batch.size": four},
                t_0=ModelPartition(range_threshold=10))
    first = records_of(h, T0, 1)
    h.run_until_idle()
    assert h.core.partition_state(T0).max_inflight_sequences == 10
    h.core.update_leader(T0, 2, 1)
    sent = first + [c for _ in range(5) for c in records_of(h, T0, 4)]
    reqs = h.send(2)
    in_flight = sum(len(r.batches[0].cookies) for r in reqs)
    for r in reqs:
        h.process(r)
    for r in reqs:
        h.lose(r)
    for _ in range(200):
        h.now += 1
        h.roundtrip(2)
    assert h.models[T0].log == sent
    assert h.core.producer_epoch == 0
    assert in_flight <= 10   # not 20 sequences


# ------------------------------------------------------------------ issue 14: message formats learned from an error

def test_required_unsupported_format_answer_fails_the_batch_without_retry_or_bump():
    h = Harness({"enable.idempotence": "required", **many()})
    p0, p1 = TopicPartition("old", 0), TopicPartition("old", 1)
    h.add_partition(p0, ModelPartition())
    h.add_partition(p1, ModelPartition())
    c = fill(h, p0, 1) + fill(h, p1, 1)
    reqs = h.send()
    for r in reqs:
        h.error(r, E.UNSUPPORTED_FOR_MESSAGE_FORMAT)
    for r in reqs:
        h.deliver(r)
    assert all(isinstance(h.results[x][1], IdempotenceUnsupportedError) for x in c)
    assert not any(h.results[x][1].possibly_written for x in c)
    assert h.send() == []                       # nothing goes out again
    assert not h.core.bump_requested and h.core.producer_epoch == 0
    with pytest.raises(IdempotenceUnsupportedError):
        h.produce(p0, 1)


def test_requested_unsupported_format_on_several_partitions_resends_all_plain():
    h = Harness({"enable.idempotence": "requested", **many()})
    tps = [TopicPartition("old", i) for i in range(3)]
    for tp in tps:
        h.add_partition(tp, ModelPartition())
    c = [fill(h, tp, 2) for tp in tps]
    reqs = h.send()
    for r in reqs:
        h.error(r, E.UNSUPPORTED_FOR_MESSAGE_FORMAT)
    for r in reqs:
        h.deliver(r)
    h.run_until_idle()
    for tp, cs in zip(tps, c):
        assert h.models[tp].log == cs
        assert [h.results[x] for x in cs] == [(0, None), (1, None)]
        assert not h.core.partition_state(tp).idempotent


# ------------------------------------------------------------------ issue 14: configuration as Kafka checks it

def test_retries_zero_with_idempotence_is_a_config_error():
    for mode in ("required", "requested", "true"):
        with pytest.raises(ConfigError, match="retries"):
            ProducerConfig.from_dict({"bootstrap.servers": "x", "retries": 0, "enable.idempotence": mode})
    # not set by the user: idempotence is turned off, as Kafka does
    cfg = ProducerConfig.from_dict({"bootstrap.servers": "x", "retries": 0})
    assert cfg.idempotence is Idempotence.OFF


def test_delivery_timeout_must_cover_linger_and_request_timeout():
    with pytest.raises(ConfigError, match="delivery.timeout.ms"):
        ProducerConfig.from_dict({"bootstrap.servers": "x", "delivery.timeout.ms": 1000,
                                  "linger.ms": 10, "request.timeout.ms": 1000})
    cfg = ProducerConfig.from_dict({"bootstrap.servers": "x", "linger.ms": 10, "request.timeout.ms": 200000})
    assert cfg.delivery_timeout_ms == 200010   # the default is raised, as Kafka does
    ProducerConfig.from_dict({"bootstrap.servers": "x", "delivery.timeout.ms": 1010,
                              "linger.ms": 10, "request.timeout.ms": 1000})


@pytest.mark.parametrize("reported", [0, -1, -100])
def test_window_below_1_from_a_broker_is_ignored_with_a_warning(reported, caplog):
    h = Harness(many(), t_0=ModelPartition(reported=reported))
    with caplog.at_level(logging.WARNING):
        cookies = fill(h, T0, 20)
        h.run_until_idle()
    assert h.models[T0].log == cookies
    assert h.core.partition_state(T0).window == 5
    assert h.core.partition_state(T0).max_in_flight_seen == 5
    assert "ProducerStateBatchesToRetain" in caplog.text


# ------------------------------------------------------------------ issue 14: base offset -1

def test_success_with_base_offset_minus_1_reports_offsets_unknown():
    h = Harness({}, t_0=ModelPartition())
    c = h.produce(T0, 3)
    r = h.send()[0]
    r.results = [PartitionResult(error_code=0, base_offset=-1)]
    h.deliver(r)
    assert [h.results[x] for x in c] == [(None, None)] * 3


# ------------------------------------------------------------------ issue 14: when the window resets, whose leader wins

def test_new_connection_to_a_node_resets_its_partitions_windows():
    a, b = TopicPartition("a", 0), TopicPartition("b", 0)
    h = Harness(many())
    h.add_partition(a, ModelPartition(window=20), node=1)
    h.add_partition(b, ModelPartition(window=20), node=2)
    fill(h, a, 2)
    fill(h, b, 2)
    for _ in range(3):
        h.roundtrip(1)
        h.roundtrip(2)
    assert h.core.partition_state(a).window == 20
    h.core.on_connected(1)      # KIP-1269 "Initial State": maybe another broker version now
    assert h.core.partition_state(a).window == 5
    assert h.core.partition_state(b).window == 20
    fill(h, a, 30)
    assert len(h.send(1)) == 5
    h.run_until_idle()
    assert h.core.partition_state(a).window == 20   # rediscovered from the first answer


def test_older_leader_epoch_in_metadata_never_replaces_a_newer_one():
    h = Harness(many(), t_0=ModelPartition(window=20))
    h.core.update_leader(T0, 2, 7)
    fill(h, T0, 1)
    h.roundtrip(2)
    assert not h.core.update_leader(T0, 1, 6)     # a lagging broker's metadata
    ps = h.core.partition_state(T0)
    assert (ps.leader, ps.leader_epoch, ps.window) == (2, 7, 20)
    assert h.core.update_leader(T0, 3, 8)
    assert (ps.leader, ps.leader_epoch, ps.window) == (3, 8, 5)


def test_not_leader_with_current_leader_moves_the_partition_at_once():
    h = Harness(many(), t_0=ModelPartition())
    c = fill(h, T0, 1)
    [r] = h.send(1)
    h.error(r, E.NOT_LEADER_OR_FOLLOWER, current_leader=(2, 5))
    h.deliver(r)
    ps = h.core.partition_state(T0)
    assert (ps.leader, ps.leader_epoch) == (2, 5)
    assert h.send(1) == []
    [r] = h.send(2)                              # no Metadata round trip needed
    h.process(r)
    h.deliver(r)
    assert h.results[c[0]] == (0, None)
    # a CurrentLeader older than what is known is ignored
    fill(h, T0, 1)
    [r] = h.send(2)
    h.error(r, E.NOT_LEADER_OR_FOLLOWER, current_leader=(1, 4))
    h.deliver(r)
    assert (ps.leader, ps.leader_epoch) == (2, 5)


# ------------------------------------------------------------------ InitProducerId outcomes
# (decided by the core; the asyncio sender only carries the requests)

def _core(mode="required", backoff=100):
    return ProducerCore(ProducerConfig.from_dict({"bootstrap.servers": "x", "enable.idempotence": mode,
                                                  "retry.backoff.ms": backoff}))


def test_init_producer_id_retriable_error_is_asked_again_after_the_backoff():
    core = _core()
    assert core.producer_id_request(1000) == (-1, -1)
    assert not core.on_init_producer_id(-1, E.COORDINATOR_LOAD_IN_PROGRESS, -1, -1, 1000)
    assert core.producer_id < 0 and core.fatal is None and core.idempotent
    assert core.producer_id_wait_ms(1040) == 60
    assert core.producer_id_request(1099) is None
    assert core.producer_id_request(1100) == (-1, -1)
    assert not core.on_init_producer_id(-1, 0, 7, 0, 1110)
    assert (core.producer_id, core.producer_epoch) == (7, 0)
    assert core.producer_id_wait_ms(1110) is None and core.producer_id_request(1110) is None


def test_init_producer_id_without_an_answer_is_asked_again_after_the_backoff():
    core = _core()
    assert core.producer_id_request(0) == (-1, -1)
    core.producer_id_retry_later(OSError("connection reset"), 0)
    assert core.producer_id_request(50) is None and core.producer_id_request(100) == (-1, -1)


def test_init_producer_id_refused_for_a_fresh_id():
    # requested: the broker cannot give an id, so the producer goes on without idempotence
    core = _core("requested")
    core.producer_id_request(0)
    assert not core.on_init_producer_id(-1, E.CLUSTER_AUTHORIZATION_FAILED, -1, -1, 0)
    assert not core.idempotent and core.fatal is None
    # required: that is fatal, and a refusal is named as one (not a missing feature)
    core = _core("required")
    core.producer_id_request(0)
    assert not core.on_init_producer_id(-1, E.CLUSTER_AUTHORIZATION_FAILED, -1, -1, 0)
    assert isinstance(core.fatal, AuthorizationError) and core.fatal.code == E.CLUSTER_AUTHORIZATION_FAILED
    core = _core("required")
    core.producer_id_request(0)
    assert not core.on_init_producer_id(-1, E.UNSUPPORTED_VERSION, -1, -1, 0)
    assert isinstance(core.fatal, IdempotenceUnsupportedError)


def test_a_refused_bump_asks_for_a_fresh_id_once_and_then_takes_the_answer():
    core = _core()
    core.producer_id_request(0)
    core.on_init_producer_id(-1, 0, 7, 32767, 0)
    core.bump_requested = True
    assert core.producer_id_request(0) == (-1, -1)   # the epoch is exhausted: a new id
    core.init_pid_in_progress = False
    core.producer_id, core.producer_epoch = 7, 3
    # a broker that bumps (KIP-360) is asked with the id and epoch; one that cannot, without
    assert core.init_producer_id_fields(7, 3, 3) == (7, 3)
    assert core.init_producer_id_fields(7, 3, 2) == (-1, -1)
    assert core.on_init_producer_id(7, E.INVALID_PRODUCER_EPOCH, -1, -1, 0)   # ask afresh
    assert core.fatal is None
    assert not core.on_init_producer_id(7, 0, 9, 0, 0, retried=True)
    assert (core.producer_id, core.producer_epoch) == (9, 0)
    # a refused bump whose fresh request is refused too is fatal, not asked a third time
    assert core.on_init_producer_id(9, E.PRODUCER_FENCED, -1, -1, 0)
    assert not core.on_init_producer_id(9, E.PRODUCER_FENCED, -1, -1, 0, retried=True)
    assert "InitProducerId failed: PRODUCER_FENCED" in str(core.fatal)


def test_an_unknown_error_on_a_bump_is_fatal():
    core = _core()
    core.producer_id_request(0)
    core.on_init_producer_id(-1, 0, 7, 0, 0)
    assert not core.on_init_producer_id(7, 9999, -1, -1, 0)
    assert "UNKNOWN_ERROR_9999" in str(core.fatal)


def test_no_init_producer_id_on_the_broker():
    core = _core("requested")
    core.producer_id_request(0)
    core.on_init_producer_id_unsupported()
    assert not core.idempotent and not core.init_pid_in_progress and core.fatal is None


# ------------------------------------------------------------------ buffer.memory admission

def test_admission_counts_bytes_admitted_but_not_appended_yet():
    cfg = ProducerConfig.from_dict({"bootstrap.servers": "x", "batch.size": 1000, "buffer.memory": 1000})
    acc = ProducerCore(cfg).acc
    assert acc.admits(5000)                  # an empty buffer takes anything
    assert not acc.admits(600, pending=500)
    assert acc.admits(500, pending=500)
    acc.used_bytes = 900
    assert acc.admits(100) and not acc.admits(101)
    assert not acc.admits(1, pending=100)
