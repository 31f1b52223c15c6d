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

def _copied(source: bytes, instance="l.1", txn=1, tag=b"C") -> bytes:
    return b"%s|%s|%d|%s" % (source, instance.encode(), txn, tag)


IN = [b"in-0", b"in-1", b"in-2"]


def test_transactions_clean_copy_has_no_findings():
    from oncelog.testing.checker import check_transactions
    committed = {0: [(0, _copied(b"in-0")), (1, _copied(b"in-1")), (5, _copied(b"in-2", txn=3))]}
    uncommitted = {0: committed[0][:2] + [(3, _copied(b"in-2", txn=2, tag=b"A"))] + committed[0][2:]}
    r = check_transactions(IN, committed, uncommitted, {("l.1", 2)})
    assert r.ok, r.to_json()
    assert (r.inputs, r.committed_read, r.uncommitted_read, r.aborted_seen) == (3, 3, 4, 1)


def test_transactions_duplicate_lost_aborted_read_and_missing_aborts():
    from oncelog.testing.checker import check_transactions
    committed = {0: [(0, _copied(b"in-0")), (1, _copied(b"in-0", txn=2)), (2, _copied(b"in-1", txn=4, tag=b"A")),
                     (3, _copied(b"in-1", instance="l.2", txn=7))]}
    r = check_transactions(IN, committed, committed, {("l.2", 7)})
    assert r.counts() == {"duplicate": 2, "lost": 1, "aborted-read": 2}
    r = check_transactions([b"in-0"], {0: [(0, _copied(b"in-0"))]}, {0: [(0, _copied(b"in-0"))]}, set())
    assert r.counts() == {"aborts-missing": 1}
    assert check_transactions([b"in-0"], {0: [(0, _copied(b"in-0"))]}, {0: [(0, _copied(b"in-0"))]}, set(),
                              expect_aborts=False).ok


def test_transactions_inputs_beyond_the_committed_offsets():
    from oncelog.testing.checker import check_transactions
    out = {0: [(0, _copied(b"in-0")), (1, _copied(b"in-2"))]}
    r = check_transactions({b"in-0": True, b"in-1": False, b"in-2": False}, out, out, set(), expect_aborts=False)
    assert r.counts() == {"copied-without-offsets": 1} and r.not_copied == 1
