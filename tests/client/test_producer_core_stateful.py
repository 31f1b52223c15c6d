"""Hypothesis stateful test of the producer core against a model broker.

Two brokers (nodes 1 and 2) share each partition's log, as brokers on one machine share a
directory; each node handles its requests in the order they were sent (one TCP connection), may
refuse one without appending (a retriable or a non-retriable error), or handle it and lose the
answer (a dropped connection); answers reach the client in any order. Leaders move (also in
range mode), and the client hears of it late, from stale metadata, or from a CurrentLeader.
Time passes, so batches reach delivery.timeout.ms or run out of retries while their outcome is
unknown; the producer may be fenced (a fatal error) or closed with batches on the wire.

Whatever happens:
- each record is in the log at most once, and a producer's records are in the order it sent them;
- every record handed to the producer is resolved exactly once (the harness refuses a second
  completion; at the end none is missing);
- a record reported successful is in the log, at the reported offset unless that is None;
- a record that failed with `possibly_written` False is not in the log (now or later); one that
  failed with it True may be there (once) or not: that is all the producer can know.
Without faults that fail records (timeouts, retries used up, non-retriable errors, fencing,
close) every record ends in the log, in order, acknowledged at its offset.
"""
import os

from core_harness import Harness
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from model_broker import ModelPartition
from tests.tiers import examples

from oncelog.client.errors import ProducerClosedError
from oncelog.client.types import TopicPartition
from oncelog.protocol.errors import ErrorCode as E

TPS = [TopicPartition("a", 0), TopicPartition("b", 0)]
NODES = [1, 2]
RETRIABLE = [E.NOT_LEADER_OR_FOLLOWER, E.REQUEST_TIMED_OUT, E.NOT_ENOUGH_REPLICAS]
NON_RETRIABLE = [E.INVALID_RECORD, E.MESSAGE_TOO_LARGE, E.TOPIC_AUTHORIZATION_FAILED]
NEVER = 10**9


# Faults are switched on per run (swarm testing): a run with a few of them applies each often
# enough to build the sequences that matter (two batches written, both answers lost, one of them
# out of time) instead of diluting every one among all the others.
FAULTS = ("refuse", "reject", "fence", "drop_one", "reset", "move", "stale", "close", "time", "expiry")


def active(self):
    return not self.closed and self.h.core.fatal is None


def on(fault, also=lambda self: True):
    return precondition(lambda self: fault in self.faults and also(self))


def late(self):
    """Faults that end a run (close, fencing) wait until something happened."""
    return active(self) and sum(map(len, self.sent_order.values())) >= 12


def unhandled(self):
    return any(r.results is None for r in self.h.in_flight)


class InFlightMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = None
        self.sent_order: dict = {tp: [] for tp in TPS}
        self.closed = False
        self.lossy = False   # a rule ran that may fail records

    @initialize(window_a=st.sampled_from([5, 7, 20]), window_b=st.sampled_from([5, 10]),
          max_in_flight=st.sampled_from([1, 3, 8, 50]), batch=st.sampled_from([1, 200]),
          range_mode=st.booleans(), threshold=st.sampled_from([10, 40]),
          delivery_timeout=st.sampled_from([NEVER, 15, 40]),
          retries=st.sampled_from([2**31 - 1, 1, 1, 3]),
          faults=st.sets(st.sampled_from(FAULTS), min_size=1, max_size=4), warm=st.booleans())
    def setup(self, window_a, window_b, max_in_flight, batch, range_mode, threshold,
              delivery_timeout, retries, faults, warm):
        self.faults = faults
        self.range_mode = range_mode
        self.threshold = threshold
        self.h = Harness({"max.in.flight.requests.per.connection": max_in_flight, "batch.size": batch,
                          "delivery.timeout.ms": delivery_timeout, "request.timeout.ms": 1,
                          "retries": retries})
        self.lossy = delivery_timeout != NEVER or retries != 2**31 - 1
        self.h.add_partition(TPS[0], ModelPartition(window=window_a))
        self.h.add_partition(TPS[1], ModelPartition(window=window_b,
                                                    range_threshold=threshold if range_mode else None))
        for m in self.h.models.values():
            m.leader = 1
        if warm:   # each partition's first batch acknowledged: the window applies from the start
            for tp in TPS:
                self.produce(tp, 1)
            self.h.roundtrip(1)
            self.h.roundtrip(1)

    # ---------------------------------------------------------------- the producer

    @rule(tp=st.sampled_from(TPS), n=st.integers(1, 6))
    @precondition(active)
    def produce(self, tp, n):
        self.sent_order[tp] += self.h.produce(tp, n)

    @rule(dt=st.integers(1, 8))
    def send(self, dt):
        self.h.now += dt
        for node in NODES:
            self.h.send(node)

    @rule(dt=st.integers(1, 30))
    @on("time")
    def time_passes(self, dt):
        self.h.now += dt

    @rule()
    @on("close", late)
    def close(self):
        """close(timeout) ran out: everything still held is failed now, on the wire or not."""
        self.h.core.fail_all(ProducerClosedError("closed"))
        self.h.collect()
        self.closed = self.lossy = True

    # ---------------------------------------------------------------- the brokers

    def _unprocessed(self, node=None):
        return [r for r in self.h.in_flight if r.results is None and (node is None or r.node == node)]

    def _next(self, data):
        """The oldest unhandled request of some node (each node handles its own in order)."""
        nodes = sorted({r.node for r in self._unprocessed()})
        return self._unprocessed(data.draw(st.sampled_from(nodes)))[0]

    @rule(data=st.data(), name_leader=st.booleans())
    @precondition(unhandled)
    def broker_handles_next(self, data, name_leader):
        self.h.process(self._next(data), name_leader=name_leader)

    @rule()
    @precondition(unhandled)
    def brokers_handle_everything_sent(self):
        for r in self._unprocessed():
            self.h.process(r)

    @rule(data=st.data(), code=st.sampled_from(RETRIABLE))
    @on("refuse", unhandled)
    def broker_refuses_next(self, data, code):
        self.h.error(self._next(data), code)

    @rule(data=st.data(), code=st.sampled_from(NON_RETRIABLE))
    @on("reject", unhandled)
    def broker_rejects_a_batch(self, data, code):
        """One partition's batch is refused for good (before anything is appended), the
        request's other batches are handled."""
        r = self._next(data)
        self.h.process(r, refuse={data.draw(st.sampled_from([b.tp for b in r.batches])): code})
        self.lossy = True

    @rule(data=st.data())
    @on("fence", lambda self: late(self) and unhandled(self))
    def producer_fenced(self, data):
        self.h.error(self._next(data), E.PRODUCER_FENCED)
        self.lossy = True

    @rule(data=st.data())
    @precondition(lambda self: any(r.results is not None for r in self.h.in_flight))
    def answer_arrives(self, data):
        answered = [r for r in self.h.in_flight if r.results is not None]
        self.h.deliver(data.draw(st.sampled_from(answered)))

    @rule(data=st.data())
    @on("drop_one", lambda self: bool(self.h.in_flight))
    def connection_drops_one(self, data):
        """Handled or not, the client never hears back about this request."""
        r = data.draw(st.sampled_from(self.h.in_flight))
        # requests are handled in order, so only the oldest unhandled one may be handled now
        if r.results is None and r is self._unprocessed(r.node)[0] and data.draw(st.booleans()):
            self.h.process(r)
        self.h.lose(r)

    @rule(node=st.sampled_from(NODES), data=st.data())
    @on("reset")
    def connection_resets(self, node, data):
        """Every request on the connection is lost (a prefix of those not yet handled is
        handled first); the client then connects again (KIP-1269: windows back to 5)."""
        mine = [r for r in self.h.in_flight if r.node == node]
        handled = data.draw(st.integers(0, len(self._unprocessed(node))))
        for r in self._unprocessed(node)[:handled]:
            self.h.process(r)
        for r in mine:
            self.h.lose(r)
        self.h.core.on_connected(node)
        for tp in TPS:
            if self.h.core.partition_state(tp).leader == node:
                assert self.h.core.partition_state(tp).window == 5

    @rule(tp=st.sampled_from(TPS))
    @on("expiry", lambda self: not self.h.in_flight and not any(
        self.h.core.partition_state(tp).unacked for tp in TPS))
    def producer_expires_under_retention(self, tp):
        """The producer idles past producer.id.expiration.ms and retention moves the log start to
        the end (as verify's expiry fault does): its next batch meets UNKNOWN_PRODUCER_ID with a
        log start above everything it had acknowledged, and restarts its sequence."""
        m = self.h.models[tp]
        m.expire_producers()
        m.delete_before(m.log_start + len(m.log))

    # ---------------------------------------------------------------- leadership

    @rule(tp=st.sampled_from(TPS), node=st.sampled_from(NODES))
    @on("move")
    def leader_moves(self, tp, node):
        """The controller moves the partition (a new leader epoch); the client does not know yet."""
        m = self.h.models[tp]
        m.leader, m.leader_epoch = node, m.leader_epoch + 1

    @rule(tp=st.sampled_from(TPS))
    def metadata_arrives(self, tp):
        m = self.h.models[tp]
        ps = self.h.core.partition_state(tp)
        before = (ps.leader, ps.leader_epoch)
        self.h.core.update_leader(tp, m.leader, m.leader_epoch)
        if before != (m.leader, m.leader_epoch):
            assert ps.window == 5   # KIP-1269: reset on a leader change

    @rule(tp=st.sampled_from(TPS))
    @on("stale", lambda self: any(self.h.core.partition_state(tp).leader_epoch > 0 for tp in TPS))
    def stale_metadata_arrives(self, tp):
        ps = self.h.core.partition_state(tp)
        if ps.leader_epoch > 0:
            before = (ps.leader, ps.leader_epoch, ps.window)
            self.h.core.update_leader(tp, 3 - ps.leader, ps.leader_epoch - 1)
            assert (ps.leader, ps.leader_epoch, ps.window) == before

    # ---------------------------------------------------------------- what must hold

    @invariant()
    def each_record_at_most_once_and_in_order(self):
        for tp in TPS:
            m = self.h.models[tp]
            log = m.deleted + m.log   # offsets from 0: what retention removed was in the log
            assert len(log) == len(set(log)), f"duplicate in {tp}: {log}"
            in_log = set(log)
            expected = [c for c in self.sent_order[tp] if c in in_log]
            assert log == expected, f"order broken in {tp}: {log}"

    @invariant()
    def outcomes_match_the_log(self):
        where = {c: (tp, i) for tp in TPS
                 for i, c in enumerate(self.h.models[tp].deleted + self.h.models[tp].log)}
        for c, (off, err) in self.h.results.items():
            if err is None:
                assert c in where, f"record {c} reported written, not in the log"
                assert off is None or off == where[c][1], f"record {c} reported at {off}, is at {where[c]}"
            elif not err.possibly_written:
                assert c not in where, f"record {c} failed ({err!r}) but is in the log at {where[c]}"

    @invariant()
    def limits_respected(self):
        core = self.h.core
        for node in NODES:
            assert core.node_in_flight.get(node, 0) <= core.config.max_in_flight
        for tp in TPS:
            ps = core.partition_state(tp)
            # never above the largest window (20) or range threshold a leader reported
            assert ps.in_flight <= max(20, self.threshold)

    def teardown(self):
        h = self.h
        # the network heals: everything in flight is answered, the client learns the leaders
        # and the producer drains (or, closed or fenced, only the answers come)
        for r in list(h.in_flight):
            if r.results is None:
                h.process(r)
        for r in list(h.in_flight):
            h.deliver(r)
        for tp in TPS:
            m = h.models[tp]
            h.core.update_leader(tp, m.leader, m.leader_epoch)
        for _ in range(5000):
            if not h.core.has_pending() and not h.in_flight:
                break
            h.now += 1
            for node in NODES:
                h.roundtrip(node)
        else:
            raise AssertionError("producer did not settle")
        stats = h.core.stats
        for name in ("given_up", "resolved", "epoch_bumps", "sequence_resets", "duplicates"):
            event(f"{name}: {'yes' if stats[name] else 'no'}")   # --hypothesis-show-statistics
        event(f"ended {'fenced' if h.core.fatal else 'closed' if self.closed else 'running'}")
        self.each_record_at_most_once_and_in_order()
        self.outcomes_match_the_log()
        sent = [c for tp in TPS for c in self.sent_order[tp]]
        missing = [c for c in sent if c not in h.results]
        assert not missing, f"records never resolved: {missing}"
        if not self.lossy:
            assert h.core.fatal is None
            for tp in TPS:
                log = h.models[tp].deleted + h.models[tp].log
                assert log == self.sent_order[tp], (tp, log, self.sent_order[tp])
                for i, c in enumerate(self.sent_order[tp]):
                    off, err = h.results[c]
                    assert err is None, err
                    assert off is None or off == i, (tp, c, off, i)


InFlightMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("ONCELOG_HYPOTHESIS_EXAMPLES", examples(300))), stateful_step_count=60,
    deadline=None)
TestInFlight = InFlightMachine.TestCase
