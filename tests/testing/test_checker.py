from oncelog.testing.checker import Event, check


def _history(values, partition=0, producer="p1", client="oncelog", first_offset=0):
    ev, t = [], 0
    for v in values:
        ev.append(Event(t, client, producer, "send", v, partition))
        t += 1
    for i, v in enumerate(values):
        ev.append(Event(t, client, producer, "ack", v, partition, first_offset + i))
        t += 1
    return ev


VALUES = [f"v{i}".encode() for i in range(5)]


def test_clean_history_has_no_findings():
    log = {0: list(enumerate(VALUES))}
    r = check(_history(VALUES), log)
    assert r.ok, r.dumps()
    assert (r.sent, r.acked, r.read) == (5, 5, 5)


def test_planted_duplicate_is_reported():
    log = {0: list(enumerate(VALUES)) + [(5, b"v2")]}
    r = check(_history(VALUES), log)
    assert r.counts() == {"duplicate": 1}
    f = r.findings[0]
    assert f.value == b"v2" and "[(0, 2), (0, 5)]" in f.detail and f.history


def test_planted_loss_is_reported_with_broker_blame():
    log = {0: [(o, v) for o, v in enumerate(VALUES) if v != b"v3"]}
    r = check(_history(VALUES), log)
    assert [f.kind for f in r.findings] == ["lost"]
    assert r.findings[0].blame == "broker" and r.findings[0].value == b"v3"


def test_acked_offset_holding_another_value_is_inconsistent():
    log = {0: [(0, b"v0"), (1, b"v1"), (2, b"other"), (3, b"v3"), (4, b"v4"), (5, b"v2")]}
    r = check(_history(VALUES), log)
    assert "inconsistent" in r.counts()
    assert "reorder" in r.counts()  # v2 sent before v3, stored after it


def test_planted_reordering_is_reported():
    log = {0: [(0, b"v0"), (1, b"v2"), (2, b"v1"), (3, b"v3"), (4, b"v4")]}
    hist = _history(VALUES)
    r = check(hist, log)
    assert "reorder" in r.counts()
    assert any(f.value == b"v1" for f in r.findings if f.kind == "reorder")


def test_reordering_ignored_for_producers_without_an_order_promise():
    log = {0: [(0, b"v0"), (1, b"v2"), (2, b"v1"), (3, b"v3"), (4, b"v4")]}
    hist = [e for e in _history(VALUES) if e.kind == "send"]  # no acks: offsets not compared
    assert check(hist, log, ordered_producers=set()).ok


def test_fatal_error_blamed_on_client_and_unacked_error_is_not_loss():
    hist = _history(VALUES[:2]) + [Event(100, "librdkafka", "p2", "send", b"x", 1),
                                   Event(101, "librdkafka", "p2", "fatal", b"x", 1,
                                         error="OUT_OF_ORDER_SEQUENCE_NUMBER")]
    r = check(hist, {0: [(0, b"v0"), (1, b"v1")], 1: []})
    assert r.counts() == {"fatal": 1}
    assert r.findings[0].blame == "client" and r.errors == 1


def test_report_json_round_trips():
    import json
    r = check(_history(VALUES), {0: list(enumerate(VALUES))[:4]})
    d = json.loads(r.dumps())
    assert d["ok"] is False and d["counts"] == {"lost": 1}


def history(client="oncelog", producer="p", values=(b"a", b"b", b"c"), partition=0, offsets=None):
    events, t = [], 0
    for v in values:
        events.append(Event(t, client, producer, "send", v))
        t += 1
    for i, v in enumerate(values):
        events.append(Event(t, client, producer, "ack", v, partition, (offsets or range(len(values)))[i]))
        t += 1
    return events


def test_order_is_per_producer_and_partition():
    a = history(producer="p1", values=(b"a1", b"a2"), offsets=[0, 2])
    b = [Event(e.t + 100, e.client, "p2", e.kind, e.value.replace(b"a", b"b"), e.partition,
               None if e.offset is None else e.offset * 2 + 1 if e.kind == "ack" else None)
         for e in history(producer="p2", values=(b"a1", b"a2"))]
    report = check(a + b, {0: [(0, b"a1"), (1, b"b1"), (2, b"a2"), (3, b"b2")]})
    assert report.ok, report.dumps()


def test_fatal_client_errors_are_grouped_and_blamed_on_the_client():
    events = history(values=(b"a",)) + [
        Event(10 + i, "librdkafka", "r", kind, b"r%d" % i, None, None, "OUT_OF_ORDER_SEQUENCE_NUMBER")
        for i, kind in enumerate(["send", "fatal", "send", "fatal"])]
    report = check(events, {0: [(0, b"a")]})
    [f] = report.findings
    assert (f.kind, f.blame) == ("fatal", "client") and "2 records failed" in f.detail
    assert report.broker_ok and not report.ok


def test_findings_name_the_client_whose_value_it_is():
    events = history(client="kafka-python")
    report = check(events, {0: [(0, b"a"), (2, b"c")]})
    assert [f.client for f in report.findings] == ["kafka-python"]


def test_unacknowledged_value_missing_is_not_a_loss():
    events = history(values=(b"a",)) + [Event(10, "oncelog", "p", "send", b"z"),
                                        Event(11, "oncelog", "p", "error", b"z", None, None, "timeout")]
    report = check(events, {0: [(0, b"a")]})
    assert report.ok and report.errors == 1


def test_record_reported_not_written_but_in_the_log_is_a_finding():
    hist = [Event(0, "oncelog", "p1", "send", b"a", 0), Event(1, "oncelog", "p1", "send", b"b", 0),
            Event(2, "oncelog", "p1", "send", b"c", 0),
            Event(3, "oncelog", "p1", "error", b"a", None, None, "DeliveryTimeoutError", False),
            Event(4, "oncelog", "p1", "error", b"b", None, None, "DeliveryTimeoutError", True),
            Event(5, "oncelog", "p1", "error", b"c", None, None, "DeliveryTimeoutError", False)]
    r = check(hist, {0: [(0, b"a"), (1, b"b")]})
    # a: said "not written", is there; b: "possibly written", may be; c: not written, is not
    assert [(f.kind, f.value) for f in r.findings] == [("failed-but-written", b"a")]
    assert r.findings[0].blame == "both"


# ---------------------------------------------------------------- transactions
# Hand-made histories of the transactions workload, each with exactly one anomaly class (the copy
# loop's records are `<input>|<instance>|<txn>|<C or A>`, as txn_workloads writes them).

import pytest  # noqa: E402

from oncelog.testing.txn_checker import check_transactions  # noqa: E402
from oncelog.testing.txn_history import History, load  # noqa: E402


def _out(source: bytes, txn: int, tag=b"C", instance="l.1") -> bytes:
    return b"%s|%s|%d|%s" % (source, instance.encode(), txn, tag)


A0, A1, B0, B1 = b"oncelog-0", b"oncelog-2", b"oncelog-1", b"oncelog-3"   # input p0: A0 A1, p1: B0 B1


class Run:
    """A clean run: loop l.1 copies input partitions 0 and 1 in three transactions (the second
    aborted on purpose, then copied again by the third); a reader follows the output."""

    def __init__(self, protocol="TV1") -> None:
        h = self.history = History()
        self.inputs = {"in": {0: [(0, A0), (1, A1)], 1: [(0, B0), (1, B1)]}}
        self.covered = dict.fromkeys([A0, A1, B0, B1], True)
        h.assign("l.1", "oncelog", "in", {0: 0, 1: 0})
        self.t1 = h.txn("l.1", "oncelog", "in", [(0, 0, A0), (1, 0, B0)], protocol)
        self.t1.sent += [[0, _out(A0, 1), 0], [1, _out(B0, 1), 0]]
        self.t1.type = "ok"
        self.t2 = h.txn("l.1", "oncelog", "in", [(0, 1, A1), (1, 1, B1)], protocol)
        self.t2.sent += [[0, _out(A1, 2, b"A"), 2], [1, _out(B1, 2, b"A"), 2]]   # markers at 1
        h.assign("l.1", "oncelog", "in", {0: 1, 1: 1})
        self.t3 = h.txn("l.1", "oncelog", "in", [(0, 1, A1), (1, 1, B1)], protocol)
        self.t3.sent += [[0, _out(A1, 3), 4], [1, _out(B1, 3), 4]]               # markers at 3
        self.t3.type = "ok"
        self.committed = {0: [(0, _out(A0, 1)), (4, _out(A1, 3))], 1: [(0, _out(B0, 1)), (4, _out(B1, 3))]}
        self.uncommitted = {0: [(0, _out(A0, 1)), (2, _out(A1, 2, b"A")), (4, _out(A1, 3))],
                            1: [(0, _out(B0, 1)), (2, _out(B1, 2, b"A")), (4, _out(B1, 3))]}
        h.assign("reader", "oncelog", "verify-out", {0: 0, 1: 0})
        self.poll1 = h.poll("reader", "oncelog", "verify-out", [(0, 0, _out(A0, 1)), (1, 0, _out(B0, 1))])
        self.poll2 = h.poll("reader", "oncelog", "verify-out", [(0, 4, _out(A1, 3)), (1, 4, _out(B1, 3))])
        self.stuck: set[int] = set()

    def check(self):
        return check_transactions(self.history, self.committed, self.uncommitted, self.covered,
                                  inputs=self.inputs, stuck=self.stuck)


def test_transactions_clean_history_has_no_anomaly():
    r = Run().check()
    assert r.ok and r.counts() == {}, r.to_json()
    assert (r.inputs, r.committed_read, r.uncommitted_read, r.aborted_seen) == (4, 4, 6, 2)
    assert r.transactions == {"oncelog TV1": {"ok": 2, "fail": 1}}
    assert r.by_client() == {"oncelog TV1": {}}


def test_aborted_read_in_the_final_read():
    """G1a: the aborted transaction committed (a late COMMIT), and nothing was copied again."""
    run = Run()
    run.history.ops = [op for op in run.history.ops if op is not run.t3 and op is not run.poll2]
    run.committed = {0: [(0, _out(A0, 1)), (2, _out(A1, 2, b"A"))], 1: [(0, _out(B0, 1)), (2, _out(B1, 2, b"A"))]}
    run.uncommitted = run.committed
    r = run.check()
    assert r.counts() == {"G1a": 2}, r.to_json()
    assert {(f.client, f.protocol) for f in r.findings} == {("oncelog", "TV1")}
    assert r.by_client() == {"oncelog TV1": {"G1a": 2}}


def test_aborted_read_by_a_reader_during_the_run():
    """G1a: a reader was given a record of the aborted transaction that the final read does not hold."""
    run = Run()
    run.poll2.polled.insert(0, (0, 2, _out(A1, 2, b"A")))
    r = run.check()
    assert r.counts() == {"G1a": 1}, r.to_json()
    assert "returned to reader" in r.findings[0].detail


def test_lost_write():
    """A committed transaction's records are missing, though the read reached the partitions' end."""
    run = Run()
    run.committed = {0: run.committed[0][:1], 1: run.committed[1][:1]}
    run.uncommitted = {p: recs[:2] for p, recs in run.uncommitted.items()}
    run.history.ops.remove(run.poll2)
    run.covered.update({A1: False, B1: False})   # the group's offsets did not move either
    r = run.check()
    assert r.counts() == {"lost-write": 2}, r.to_json()
    assert r.not_copied == 2


def test_unseen_where_read_committed_could_not_read():
    run = Run()
    run.committed = {0: run.committed[0][:1], 1: run.committed[1][:1]}
    run.history.ops.remove(run.poll2)
    run.covered.update({A1: False, B1: False})
    run.stuck = {0, 1}
    r = run.check()
    assert r.counts() == {"unseen": 2, "hanging-transaction": 2}, r.to_json()
    run.covered.update({A1: True, B1: True})   # copied where the read could not reach: not lost
    assert run.check().counts() == {"unseen": 2, "hanging-transaction": 2}


def test_duplicate():
    """One record at two offsets."""
    run = Run()
    run.committed[0].insert(1, (1, _out(A0, 1)))
    run.uncommitted[0].insert(1, (1, _out(A0, 1)))
    run.poll2.polled.insert(0, (0, 1, _out(A0, 1)))
    r = run.check()
    assert r.counts() == {"duplicate": 1}, r.to_json()


def test_torn_transaction():
    """A transaction whose outcome the client does not know is half visible."""
    run = Run()
    run.t3.type = "info"
    run.committed[1].pop()
    run.uncommitted[1].pop()
    run.poll2.polled.pop()
    run.covered[B1] = False
    r = run.check()
    assert r.counts() == {"torn-transaction": 1}, r.to_json()
    assert "1 of its 2 records visible, 1 missing" in r.findings[0].detail


def test_inconsistent_offsets():
    run = Run()
    run.uncommitted[0][2] = (4, b"other")
    r = run.check()
    # read_committed against read_uncommitted, and the delivery report against read_uncommitted
    assert r.counts() == {"inconsistent-offsets": 2}, r.to_json()


def test_write_cycle_is_reported_and_allowed():
    """G0: two loops' transactions follow each other in partition 0 in one order, in 1 in the other."""
    h = History()
    written = {}
    for process, client in (("l.1", "oncelog"), ("m.1", "librdkafka")):
        sources = [f"{client}-0".encode(), f"{client}-1".encode()]
        op = h.txn(process, client, client, [(p, 0, v) for p, v in enumerate(sources)], "TV1")
        op.sent += [[p, _out(v, 1, instance=process), None] for p, v in enumerate(sources)]
        op.type = "ok"
        written[client] = [entry[1] for entry in op.sent]
    committed = {0: [(0, written["oncelog"][0]), (1, written["librdkafka"][0])],
                 1: [(0, written["librdkafka"][1]), (1, written["oncelog"][1])]}
    covered = {v.rsplit(b"|", 3)[0]: True for recs in committed.values() for _o, v in recs}
    r = check_transactions(h, committed, committed, covered)
    assert r.counts() == {"G0": 1}, r.to_json()
    assert r.ok   # Kafka does not isolate writes: Jepsen allows G0
    assert r.findings[0].client == "librdkafka,oncelog"


# the order classes, over one transaction of three records in partition 0
X = [b"oncelog-%d" % i for i in range(3)]


def _three(sent_order=(0, 1, 2), stored=(0, 1, 2), txns=1):
    h = History()
    inputs = {"in": {0: [(i, x) for i, x in enumerate(X)]}}
    per = 3 // txns
    for t in range(txns):
        picks = sent_order[t * per:(t + 1) * per]
        op = h.txn("l.1", "oncelog", "in", [(0, i, X[i]) for i in picks], "TV1")
        op.sent += [[0, _out(X[i], 1), None] for i in picks]
        op.type = "ok"
    committed = {0: [(n, _out(X[i], 1)) for n, i in enumerate(stored)]}
    return h, committed, inputs


def _check(h, committed, inputs):
    return check_transactions(h, committed, committed, dict.fromkeys(X, True), inputs=inputs)


def test_int_nonmonotonic_send():
    h, committed, inputs = _three(stored=(1, 0, 2))
    assert _check(h, committed, inputs).counts() == {"int-nonmonotonic-send": 1}


def test_nonmonotonic_send():
    """Three transactions of one loop, stored in another order than the loop sent them."""
    h, committed, inputs = _three(stored=(1, 0, 2), txns=3)
    assert _check(h, committed, inputs).counts() == {"nonmonotonic-send": 1}


@pytest.mark.parametrize("polls, assigned, kind", [
    ([[0, 2]], False, "int-poll-skip"),
    ([[1, 0]], False, "int-nonmonotonic-poll"),
    ([[1, 2]], True, "poll-skip"),
    ([[0, 1], [1, 2]], True, "nonmonotonic-poll"),
])
def test_poll_classes(polls, assigned, kind):
    """A reader of the output topic whose polls skip or go back in the version order."""
    h, committed, inputs = _three()
    if assigned:
        h.assign("reader", "oncelog", "verify-out", {0: 0})
    for offsets in polls:
        h.poll("reader", "oncelog", "verify-out", [(0, o, committed[0][o][1]) for o in offsets])
    r = _check(h, committed, inputs)
    assert r.counts() == {kind: 1}, r.to_json()
    assert (r.findings[0].client, r.findings[0].protocol) == ("oncelog", "")
    assert r.by_client() == {"oncelog TV1": {}, "oncelog reader": {kind: 1}}


@pytest.mark.parametrize("rewound_to, kind", [({0: 0, 1: 1}, "poll-skip"), ({0: 2, 1: 1}, "nonmonotonic-poll")])
def test_copy_loop_poll_after_a_rewind_must_start_there(rewound_to, kind):
    """The loop's consumer after its abort polls the inputs from offset 1: had it been rewound
    to 0, it skipped one; to 2, it went back."""
    run = Run()
    run.history.ops[run.history.ops.index(run.t3) - 1].positions = rewound_to
    assert run.check().counts() == {kind: 1}


def test_consumer_positions_unknown_after_a_rebalance():
    run = Run()
    run.history.ops[run.history.ops.index(run.t3) - 1].positions = None   # librdkafka's on_assign
    assert run.check().counts() == {}


def test_history_round_trips_through_json_lines(tmp_path):
    run = Run()
    run.t3.type = "info"
    run.committed[1].pop()
    run.history.dump(tmp_path / "history.jsonl")
    again = check_transactions(load(tmp_path / "history.jsonl"), run.committed, run.uncommitted, run.covered,
                               inputs=run.inputs)
    assert again.to_json() == run.check().to_json() and again.counts()


def test_every_client_and_protocol_is_listed():
    run = Run(protocol="TV2")
    other = run.history.txn("m.1", "librdkafka", "in", [], "TV1")
    other.type = "ok"
    assert run.check().by_client() == {"librdkafka TV1": {}, "oncelog TV2": {}}


def test_copy_promise_duplicate_lost_and_copied_without_offsets():
    """The copy's own classes: an input copied by two committed transactions, one never copied
    though the offsets moved past it, one copied though they did not."""
    run = Run()
    run.t2.type = "ok"      # as if both had committed: A1 and B1 copied twice
    run.committed = {0: [(0, _out(A0, 1)), (2, _out(A1, 2, b"A")), (4, _out(A1, 3))], 1: [(4, _out(B1, 3))]}
    run.uncommitted = run.committed
    run.covered[B1] = False
    run.history.ops.remove(run.poll1)
    run.history.ops.remove(run.poll2)
    r = run.check()
    assert r.counts() == {"duplicate-copy": 1, "lost-input": 1, "copied-without-offsets": 1, "lost-write": 2,
                          "torn-transaction": 2}, r.to_json()
    [lost] = [f for f in r.findings if f.kind == "lost-input"]
    assert (lost.value, lost.client, lost.protocol) == (B0, "oncelog", "TV1")


def test_aborts_missing_unless_told_not_to_expect_them():
    run = Run()
    run.uncommitted = run.committed
    assert run.check().counts() == {"aborts-missing": 1}
    assert check_transactions(run.history, run.committed, run.committed, run.covered, inputs=run.inputs,
                              expect_aborts=False).ok


def _restamp_case(identities):
    """A duplicate of v2 at offsets 2 and 5, judged with the batch identities given per offset."""
    from oncelog.testing.checker import reclassify_restamped
    r = check(_history(VALUES), {0: list(enumerate(VALUES)) + [(5, b"v2")]})
    asked = []

    def identity(places):
        asked.append(places)
        return {pl: identities[pl[1]] for pl in places if pl[1] in identities}
    reclassify_restamped(r, identity)
    assert asked == [[(0, 2), (0, 5)]]
    return r.findings[0]


def test_a_duplicate_resent_under_a_newer_epoch_is_the_clients():
    from oncelog.testing.batch_identity import BatchIdentity
    f = _restamp_case({2: BatchIdentity(7, 0, 113, 2), 5: BatchIdentity(7, 1, 0, 5)})
    assert (f.kind, f.blame) == ("restamped", "client") and "epochs [0, 1]" in f.detail and "#4953" in f.detail


def test_a_duplicate_within_one_epoch_or_of_two_producers_stays_a_duplicate():
    from oncelog.testing.batch_identity import BatchIdentity
    # the same epoch twice: a retry the broker should have recognised
    f = _restamp_case({2: BatchIdentity(7, 1, 113, 2), 5: BatchIdentity(7, 1, 113, 5)})
    assert (f.kind, f.blame) == ("duplicate", "both")
    # the newer copy at the older epoch is not a re-stamp either
    f = _restamp_case({2: BatchIdentity(7, 1, 0, 2), 5: BatchIdentity(7, 0, 113, 5)})
    assert (f.kind, f.blame) == ("duplicate", "both")
    f = _restamp_case({2: BatchIdentity(7, 0, 113, 2), 5: BatchIdentity(8, 1, 0, 5)})  # two producers
    assert (f.kind, f.blame) == ("duplicate", "both")
    f = _restamp_case({5: BatchIdentity(7, 1, 0, 5)})   # a copy whose batch could not be read
    assert (f.kind, f.blame) == ("duplicate", "both")


@pytest.mark.processes
def test_batch_identities_name_the_producer_epoch_and_sequence_of_each_offset(shared_broker, unique_topic):
    from oncelog.client import AdminClient, Producer
    from oncelog.testing.batch_identity import batch_identities
    from oncelog.testing.embedded import free_port
    with AdminClient({"bootstrap.servers": shared_broker.bootstrap}) as admin:
        admin.create_topics([unique_topic], num_partitions=1)[unique_topic].result()
    with Producer({"bootstrap.servers": shared_broker.bootstrap, "linger.ms": 0}) as p:
        for i in range(3):
            p.send(unique_topic, b"x%d" % i, partition=0).result(30)
    # a bootstrap list as the verify harness has one (its proxies), the first server down
    got = batch_identities(f"127.0.0.1:{free_port()},{shared_broker.bootstrap}", unique_topic,
                           [(0, 0), (0, 2), (0, 9)])
    assert set(got) == {(0, 0), (0, 2)}                        # nothing at offset 9
    assert got[(0, 0)].producer_id >= 0 and got[(0, 0)].producer_epoch == 0
    assert [got[(0, o)].base_sequence for o in (0, 2)] == [0, 2] and got[(0, 2)].base_offset == 2
