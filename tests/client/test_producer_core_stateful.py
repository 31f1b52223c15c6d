"""Hypothesis stateful test of the producer core's in-flight/retry logic against a model broker.

The broker handles requests in the order they were sent (one TCP connection), may refuse one
without appending (a retriable error), or handle it and lose the answer (a dropped connection);
answers reach the client in any order. Whatever happens: no record is written twice, none is
missing, the log keeps send order, and every record's reported offset is where it is in the log.
"""
import os

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from oncelog.client.accumulator import TopicPartition
from oncelog.protocol.errors import ErrorCode as E

from core_harness import Harness
from model_broker import ModelPartition

TPS = [TopicPartition("a", 0), TopicPartition("b", 0)]
RETRIABLE = [E.NOT_LEADER_OR_FOLLOWER, E.REQUEST_TIMED_OUT, E.NOT_ENOUGH_REPLICAS]


class InFlightMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = None
        self.sent_order: dict = {tp: [] for tp in TPS}

    @rule(window_a=st.sampled_from([5, 7, 20]), window_b=st.sampled_from([5, 10]),
          max_in_flight=st.sampled_from([1, 3, 8, 50]), batch=st.sampled_from([1, 200]),
          range_mode=st.booleans())
    @precondition(lambda self: self.h is None)
    def setup(self, window_a, window_b, max_in_flight, batch, range_mode):
        self.range_mode = range_mode
        self.h = Harness({"max.in.flight.requests.per.connection": max_in_flight,
                          "batch.size": batch})
        self.h.add_partition(TPS[0], ModelPartition(window=window_a))
        self.h.add_partition(TPS[1], ModelPartition(window=window_b,
                                                    range_threshold=40 if range_mode else None))

    @rule(tp=st.sampled_from(TPS), n=st.integers(1, 6))
    @precondition(lambda self: self.h is not None)
    def produce(self, tp, n):
        self.sent_order[tp] += self.h.produce(tp, n)

    @rule()
    @precondition(lambda self: self.h is not None)
    def send(self):
        self.h.now += 1
        self.h.send()

    def _unprocessed(self):
        return [r for r in self.h.in_flight if r.results is None]

    @rule()
    @precondition(lambda self: self.h is not None and any(r.results is None for r in self.h.in_flight))
    def broker_handles_next(self):
        self.h.process(self._unprocessed()[0])

    @rule(code=st.sampled_from(RETRIABLE))
    @precondition(lambda self: self.h is not None and any(r.results is None for r in self.h.in_flight))
    def broker_refuses_next(self, code):
        self.h.error(self._unprocessed()[0], code)

    @rule(data=st.data())
    @precondition(lambda self: self.h is not None and any(r.results is not None for r in self.h.in_flight))
    def answer_arrives(self, data):
        answered = [r for r in self.h.in_flight if r.results is not None]
        self.h.deliver(data.draw(st.sampled_from(answered)))

    @rule(data=st.data())
    @precondition(lambda self: self.h is not None and bool(self.h.in_flight))
    def connection_drops_one(self, data):
        """Handled or not, the client never hears back about this request."""
        r = data.draw(st.sampled_from(self.h.in_flight))
        # requests are handled in order, so only the oldest unhandled one may be handled now
        if r.results is None and r is self._unprocessed()[0] and data.draw(st.booleans()):
            self.h.process(r)
        self.h.lose(r)

    @rule()
    @precondition(lambda self: self.h is not None)
    def leader_epoch_changes(self):
        tp = TPS[0]
        ps = self.h.core.partition_state(tp)
        self.h.core.update_leader(tp, 1, ps.leader_epoch + 1)
        assert ps.window == 5

    @invariant()
    def no_duplicate_and_order_kept(self):
        if self.h is None:
            return
        for tp in TPS:
            log = self.h.models[tp].log
            assert len(log) == len(set(log)), f"duplicate in {tp}: {log}"
            expected = [c for c in self.sent_order[tp] if c in set(log)]
            assert log == expected, f"order broken in {tp}: {log}"
            # no gap: the log is a prefix of what was sent (nothing fails in this test)
            assert log == self.sent_order[tp][:len(log)], f"gap in {tp}: {log}"

    @invariant()
    def limits_respected(self):
        if self.h is None:
            return
        core = self.h.core
        assert core.node_in_flight.get(1, 0) <= core.config.max_in_flight
        for tp in TPS:
            ps = core.partition_state(tp)
            # never above the largest window (20) or range threshold (40) a leader reported
            assert ps.in_flight <= (40 if self.range_mode and tp == TPS[1] else 20)

    def teardown(self):
        if self.h is None:
            return
        # the network heals: everything in flight is answered, then the producer drains
        h = self.h
        for r in list(h.in_flight):
            if r.results is None:
                h.process(r)
        for r in list(h.in_flight):
            h.deliver(r)
        h.run_until_idle(5000)
        for tp in TPS:
            assert h.models[tp].log == self.sent_order[tp], (tp, h.models[tp].log, self.sent_order[tp])
            for i, c in enumerate(self.sent_order[tp]):
                off, err = h.results[c]
                assert err is None, err
                assert off is None or off == i, (tp, c, off, i)
        assert h.core.fatal is None


InFlightMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("ONCELOG_HYPOTHESIS_EXAMPLES", "150")), stateful_step_count=60, deadline=None)
TestInFlight = InFlightMachine.TestCase
