"""The checker must find what it exists to find: planted duplicates, losses, inconsistent
offsets, reorderings and fatal client errors, each with a history excerpt and the right blame."""
from oncelog.testing.checker import Event, check


def history(client="oncelog", producer="p", values=(b"a", b"b", b"c"), partition=0, offsets=None):
    events, t = [], 0
    for v in values:
        events.append(Event(t, client, producer, "send", v))
        t += 1
    for i, v in enumerate(values):
        events.append(Event(t, client, producer, "ack", v, partition, (offsets or range(len(values)))[i]))
        t += 1
    return events


def test_a_clean_history_has_no_findings():
    report = check(history(), {0: [(0, b"a"), (1, b"b"), (2, b"c")]})
    assert report.ok and report.broker_ok and (report.sent, report.acked, report.read) == (3, 3, 3)


def test_planted_duplicate_is_found():
    report = check(history(), {0: [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"b")]})
    [f] = report.findings
    assert (f.kind, f.value, f.blame) == ("duplicate", b"b", "both") and "(0, 1), (0, 3)" in f.detail
    assert any("ack b'b'" in line for line in f.history)
    assert not report.broker_ok


def test_planted_loss_is_found():
    report = check(history(), {0: [(0, b"a"), (2, b"c")]})
    [f] = report.findings
    assert (f.kind, f.value, f.blame) == ("lost", b"b", "broker") and "p0@1" in f.detail


def test_unacknowledged_value_missing_is_not_a_loss():
    events = history(values=(b"a",)) + [Event(10, "oncelog", "p", "send", b"z"),
                                        Event(11, "oncelog", "p", "error", b"z", None, None, "timeout")]
    report = check(events, {0: [(0, b"a")]})
    assert report.ok and report.errors == 1


def test_planted_inconsistent_offset_is_found():
    report = check(history(offsets=[0, 1, 2]), {0: [(0, b"a"), (1, b"c"), (2, b"b")]})
    kinds = {f.kind for f in report.findings}
    assert "inconsistent" in kinds
    [f] = [f for f in report.findings if f.kind == "inconsistent" and f.value == b"b"]
    assert "holds b'c'" in f.detail and f.blame == "broker"


def test_planted_reordering_is_found():
    # b sent before c, but stored after it; acks name the stored offsets, so only order breaks
    report = check(history(offsets=[0, 2, 1]), {0: [(0, b"a"), (1, b"c"), (2, b"b")]})
    [f] = report.findings
    assert (f.kind, f.blame) == ("reorder", "both") and f.value == b"b"
    assert "sent before" in f.detail


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
