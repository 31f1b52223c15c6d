"""Batches given up while their outcome is unknown (delivery timeout, retries used up, a
non-retriable error on a later batch): resolved under their old sequences before anything is
renumbered (the Java client's unresolved sequences), so that no record is written twice."""
from core_harness import Harness
from model_broker import ModelPartition

from oncelog.client.errors import BrokerResponseError, DeliveryTimeoutError
from oncelog.client.types import TopicPartition
from oncelog.protocol.errors import ErrorCode as E

T0 = TopicPartition("t", 0)


def cfg(**kw):
    return {"max.in.flight.requests.per.connection": 60, "batch.size": 1, "request.timeout.ms": 10, **kw}


def one(h):
    return h.produce(T0, 1)[0]


def test_delivery_timeout_of_a_written_batch_does_not_renumber_the_next():
    """b1 (seq 1) and b2 (seq 2) are both written, the connection drops; b1 has passed
    delivery.timeout.ms, b2 has not. b2 must be retried under seq 2 (a duplicate, answered with
    its offset), not renumbered to epoch 1 / seq 0 and written again."""
    h = Harness(cfg(**{"delivery.timeout.ms": 1000}), t_0=ModelPartition())
    c0 = one(h)
    h.run_until_idle()
    created = h.now
    b1 = one(h)
    h.now += 500
    b2 = one(h)
    reqs = h.send()
    assert [r.batches[0].base_sequence for r in reqs] == [1, 2]
    for r in reqs:
        h.process(r)
    h.now = created + 1000          # b1 is out of time, b2 is not
    for r in reqs:
        h.lose(r)
    h.run_until_idle()
    assert h.models[T0].log == [c0, b1, b2]
    off, err = h.results[b1]
    assert isinstance(err, DeliveryTimeoutError) and err.possibly_written
    assert h.results[b2] == (2, None)
    assert h.core.producer_epoch == 0   # b2's acknowledgement proved b1 written: no bump
    # and the partition goes on under its sequences
    c3 = one(h)
    h.run_until_idle()
    assert h.models[T0].log == [c0, b1, b2, c3] and h.results[c3] == (3, None)


def test_retries_used_up_on_a_written_batch_does_not_renumber_the_next():
    h = Harness(cfg(retries=1), t_0=ModelPartition())
    c0 = one(h)
    h.run_until_idle()
    b1, b2 = one(h), one(h)
    reqs = h.send()
    for r in reqs:
        h.process(r)
    for r in reqs:
        h.lose(r)                   # first attempt of each: retried (retries=1)
    r = h.send()
    assert [x.batches[0].base_sequence for x in r] == [1]   # head of line, alone
    h.process(r[0])
    h.lose(r[0])                    # second attempt of b1: its retries are used up
    h.run_until_idle()
    assert h.models[T0].log == [c0, b1, b2]
    assert h.results[b2] == (2, None)
    assert h.results[b1][1].possibly_written


def test_non_retriable_error_on_a_later_batch_from_a_new_leader():
    """b1 written by leader 1, which dies before answering; b2 refused for good by the new
    leader 2. Only what follows b2 may be renumbered; b1 is resolved under its sequence."""
    h = Harness(cfg(), t_0=ModelPartition())
    c0 = one(h)
    h.run_until_idle()
    b1 = one(h)
    [r1] = h.send(1)
    h.process(r1)                   # written by leader 1; its answer never comes
    h.core.update_leader(T0, 2, 1)
    b2 = one(h)
    [r2] = h.send(2)
    h.error(r2, E.INVALID_RECORD)
    h.deliver(r2)
    h.lose(r1)                      # leader 1's connection fails
    c3 = one(h)
    for _ in range(20):
        h.now += 1
        h.roundtrip(2)
    assert h.models[T0].log == [c0, b1, c3]
    assert isinstance(h.results[b2][1], BrokerResponseError)
    assert not h.results[b2][1].possibly_written   # refused on its only attempt: not in the log
    assert h.results[b1] == (1, None)   # its retry under seq 1 is a duplicate with its offset
    assert h.results[c3] == (2, None)
    assert h.core.producer_epoch == 1   # the gap b2 left is closed by a bump for what follows


def test_given_up_batch_that_was_not_written_bumps_when_the_next_one_says_so():
    """The other outcome: b1 never reached the log. b2 (seq 2) gets OutOfOrderSequence right
    after the unresolved sequence: a real gap, so b2 is renumbered and written once."""
    h = Harness(cfg(**{"delivery.timeout.ms": 1000}), t_0=ModelPartition())
    c0 = one(h)
    h.run_until_idle()
    created = h.now
    b1 = one(h)
    h.now += 500
    b2 = one(h)
    reqs = h.send()
    h.error(reqs[0], E.NOT_LEADER_OR_FOLLOWER)   # b1: a leader that may have written it
    h.process(reqs[1])                          # b2: OutOfOrderSequence (gap at 1)
    h.now = created + 1000
    for r in reqs:
        h.deliver(r)
    assert h.results[b1][1].possibly_written
    h.run_until_idle()
    assert h.models[T0].log == [c0, b2]
    assert h.results[b2] == (1, None)
    assert h.core.producer_epoch == 1


def test_given_up_with_nothing_after_it_bumps_before_the_next_batch():
    """Java's maybeResolveSequences: nothing left to ask with, so assume a gap: the next batch
    starts at sequence 0 of a new epoch (written once whatever became of the given-up one)."""
    h = Harness(cfg(**{"delivery.timeout.ms": 1000}), t_0=ModelPartition())
    c0 = one(h)
    h.run_until_idle()
    b1 = one(h)
    [r] = h.send()
    h.process(r)
    h.now += 1000
    h.lose(r)
    assert h.results[b1][1].possibly_written
    c2 = one(h)
    h.run_until_idle()
    assert h.models[T0].log == [c0, b1, c2]
    assert h.core.producer_epoch == 1 and h.results[c2] == (2, None)


def test_batch_given_up_after_a_later_one_was_acknowledged_is_delivered():
    """b2's acknowledgement proves b1 written (the broker appends in sequence order): b1 given
    up later is reported delivered, offset unknown, not failed."""
    h = Harness(cfg(**{"delivery.timeout.ms": 1000}), t_0=ModelPartition())
    one(h)
    h.run_until_idle()
    created = h.now
    b1, b2 = one(h), one(h)
    reqs = h.send()
    for r in reqs:
        h.process(r)
    h.deliver(reqs[1])
    h.now = created + 1000
    h.lose(reqs[0])
    assert h.results[b1] == (None, None) and h.results[b2] == (2, None)


def test_never_sent_batch_expires_with_a_definite_error():
    h = Harness(cfg(**{"delivery.timeout.ms": 1000}), t_0=ModelPartition())
    h.core.update_leader(T0, -1)
    c = one(h)
    h.now += 1000
    h.send()
    assert isinstance(h.results[c][1], DeliveryTimeoutError)
    assert not h.results[c][1].possibly_written and h.models[T0].log == []
