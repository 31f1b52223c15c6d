"""The share workload's checker with a dead-letter topic (`testing.share_checker`, `--share-dlq`):
one dead-letter record for each record that ended rejected or at the delivery limit, none for
any other, each naming the right topic, group and value."""
from __future__ import annotations

from oncelog.testing.share_checker import (
    ACCEPT,
    ARCHIVED,
    ARCHIVING,
    DLQ_PAST_LIMIT,
    DLQ_REJECTED,
    REJECT,
    RELEASE,
    DeadLetterRecord,
    History,
    check_share,
)

LIMIT = 3


def history(*events: tuple) -> History:
    """(member, offset, count, ack kind or None, confirmed) per delivery, all of partition 0."""
    h = History()
    t = 0.0
    for member, offset, count, kind, confirmed in events:
        t += 1
        e = [["got", t, 0, offset, count, f"v{offset}", t - 0.5]]
        if kind is not None:
            e += [["ack", t + 0.1, 0, offset, count, kind]]
            if confirmed:
                e += [["ackd", t + 0.2, 0, offset, kind, None]]
        h.add_events(member, "oncelog", e)
    return h


def dl(offset: int, count: int = 1, message: str = DLQ_REJECTED, value: bytes | None = None, n: int = 0,
       topic: str = "t", group: str = "g") -> DeadLetterRecord:
    return DeadLetterRecord(0, n, topic, 0, offset, group, count, message,
                            value if value is not None else f"v{offset}".encode())


def check(h: History, dead: list[DeadLetterRecord], states=((0, 4, ARCHIVED, 0),)):
    log = {0: [(o, f"v{o}".encode()) for o in range(5)]}
    final = {0: (0, list(states))}
    return check_share(log, h, final, LIMIT, 30.0, [], dead_letters=dead, topic="t", group="g")


def test_one_dead_letter_record_per_rejected_or_limit_archived_record_is_ok():
    h = history(("m", 0, 1, ACCEPT, True), ("m", 1, 1, REJECT, True), ("m", 2, 1, ACCEPT, True),
                ("m", 3, 1, RELEASE, True), ("m", 3, 2, RELEASE, True), ("m", 3, 3, RELEASE, True),
                ("m", 4, 1, ACCEPT, True))
    r = check(h, [dl(1), dl(3, 3, DLQ_PAST_LIMIT)])
    assert r.ok, r.findings
    assert r.figures["dead-lettered: rejected"] == 1 and r.figures["dead-lettered: at the delivery limit"] == 1


def test_missing_duplicate_unexpected_and_mismatched_dead_letter_records_are_anomalies():
    h = history(("m", 0, 1, ACCEPT, True), ("m", 1, 1, REJECT, True), ("m", 2, 1, REJECT, True),
                ("m", 3, 1, ACCEPT, True), ("m", 4, 1, REJECT, True))
    r = check(h, [dl(2), dl(2, n=1), dl(3), dl(4, value=b"other")])
    assert r.counts() == {"dlq-missing": 1, "dlq-duplicate": 1, "dlq-unexpected": 1, "dlq-mismatch": 1}, r.findings
    assert {(f.kind, f.offset) for f in r.findings} == {("dlq-missing", 1), ("dlq-duplicate", 2),
                                                        ("dlq-unexpected", 3), ("dlq-mismatch", 4)}


def test_a_record_left_archiving_is_finished_but_owes_its_dead_letter_record():
    h = history(("m", 0, 1, ACCEPT, True), ("m", 1, 1, REJECT, False), ("m", 2, 1, ACCEPT, True),
                ("m", 3, 1, ACCEPT, True), ("m", 4, 1, ACCEPT, True))
    r = check(h, [], states=((0, 0, ARCHIVED, 0), (1, 1, ARCHIVING, 1), (2, 4, ARCHIVED, 0)))
    assert [(f.kind, f.offset) for f in r.findings] == [("dlq-missing", 1)]
    # a REJECT whose answer never came and whose record was not left ARCHIVING: either way is fine
    assert check(h, []).ok and check(h, [dl(1)]).ok
