"""oncelog's share consumer (`client.ShareConsumer`, KIP-932) against an oncelog broker over real
sockets: two members of one share group read one partition together, each record once, with
explicit acknowledgement; released records come back to some member with their delivery count;
implicit mode accepts what the last poll returned; close gives back what is still held."""
from __future__ import annotations

import time
from collections import Counter

import pytest

from oncelog.client import ACCEPT, RELEASE, AdminClient, NewTopic, Producer, ShareConsumer
from oncelog.protocol.errors import ErrorCode
from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.raw_client import RawConnection
from oncelog.testing.share_verify import set_group_configs

pytestmark = pytest.mark.processes
N = 300


def setup(boot: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": boot})
    try:
        admin.create_topics([NewTopic(topic, 1)])
    finally:
        admin.close()
    with RawConnection(boot) as raw:
        set_group_configs(raw, topic, {"share.auto.offset.reset": "earliest"})
    with Producer({"bootstrap.servers": boot}) as p:
        for i in range(N):
            p.send(topic, value=f"v{i}".encode())
        p.flush(30)


def test_two_members_explicit_each_record_once_and_released_ones_come_back(broker):
    topic = "oncelog-share"
    setup(broker.bootstrap, topic)
    config = {"bootstrap.servers": broker.bootstrap, "group.id": topic, "share.acknowledgement.mode": "explicit",
              "max.poll.records": 50}
    members = [ShareConsumer(config), ShareConsumer(config)]
    given: list[tuple[int, int]] = []
    try:
        for m in members:
            m.subscribe([topic])
        deadline = time.monotonic() + 60
        while len({o for o, c in given if not (o % 10 == 0 and c == 1)}) < N:
            assert time.monotonic() < deadline, f"{len(given)} records given"
            for m in members:
                for r in m.poll(0.2):
                    given.append((r.offset, r.delivery_count))
                    m.acknowledge(r, RELEASE if r.offset % 10 == 0 and r.delivery_count == 1 else ACCEPT)
    finally:
        for m in members:
            m.close()
    counts = Counter(given)
    assert max(counts.values()) == 1
    assert {o for o, _c in given} == set(range(N))
    assert {(o, c) for o, c in given if o % 10 == 0} == {(o, c) for o in range(0, N, 10) for c in (1, 2)}
    assert all(c == 1 for o, c in given if o % 10)


def test_implicit_mode_accepts_the_last_poll_and_close_gives_back_what_is_held(broker):
    topic = "oncelog-share-implicit"
    setup(broker.bootstrap, topic)
    config = {"bootstrap.servers": broker.bootstrap, "group.id": topic, "max.poll.records": 100}
    a = ShareConsumer(config)
    a.subscribe([topic])
    first: list[int] = []
    deadline = time.monotonic() + 30
    while not first:
        assert time.monotonic() < deadline
        first = [r.offset for r in a.poll(0.5)]
    a.commit_sync()     # implicit: the records of that poll are accepted now
    held: list[int] = []
    while not held:
        assert time.monotonic() < deadline
        held = [r.offset for r in a.poll(0.5)]
    # close: held records are accepted too (implicit mode commits the last poll at close)
    a.close()
    b = ShareConsumer(config)
    b.subscribe([topic])
    rest: list[tuple[int, int]] = []
    try:
        while len(rest) < N - len(first) - len(held):
            assert time.monotonic() < deadline + 30, rest[-3:]
            rest += [(r.offset, r.delivery_count) for r in b.poll(0.5)]
    finally:
        b.close()
    assert not {o for o, _c in rest} & (set(first) | set(held))
    assert sorted(first + held + [o for o, _c in rest]) == list(range(N))


def test_commit_sync_after_the_broker_lost_the_share_session_says_what_the_broker_answered(tmp_path):
    """A broker killed -9 and restarted forgets its share sessions. The member's next commit is
    refused (SHARE_SESSION_NOT_FOUND); the one after finds no session and opens one before it
    acknowledges (Kafka refuses acknowledgements in the ShareFetch that opens a session; the
    client sent them there). What commit_sync reports is the truth: a record reported
    acknowledged never comes back, one reported refused does (its lock runs out)."""
    topic = "oncelog-share-restart"
    b = BrokerProcess(tmp_path / "data", {"group.share.record.lock.duration.ms": "2000"}).start()
    try:
        setup(b.bootstrap, topic)
        config = {"bootstrap.servers": b.bootstrap, "group.id": topic, "share.acknowledgement.mode": "explicit",
                  "max.poll.records": 20}
        a = ShareConsumer(config)
        try:
            a.subscribe([topic])
            got: list = []
            deadline = time.monotonic() + 30
            while len(got) < 20:
                assert time.monotonic() < deadline, len(got)
                got += a.poll(0.5)
            b.restart(clean=False)
            answered: dict[int, int] = {}
            for part in (got[:10], got[10:20]):
                for r in part:
                    a.acknowledge(r, ACCEPT)
                codes = a.commit_sync()
                assert set(codes) == {(topic, 0)}, codes
                answered.update((r.offset, codes[(topic, 0)]) for r in part)
            assert answered[got[0].offset] == ErrorCode.SHARE_SESSION_NOT_FOUND, answered
            # the second is answered per record (the restarted broker no longer counts them as
            # this member's: INVALID_RECORD_STATE), not refused whole as a ShareFetch opening a
            # session with acknowledgements in it is (INVALID_REQUEST, what the client sent before)
            assert {answered[r.offset] for r in got[10:]} <= {0, ErrorCode.INVALID_RECORD_STATE}, answered
            confirmed = {o for o, code in answered.items() if code == 0}
            refused = set(answered) - confirmed
            # read the rest: confirmed records never again, refused ones again once their lock ran out
            again: set[int] = set()
            deadline = time.monotonic() + 60
            seen = {r.offset for r in got}
            while len(seen) < N or not refused <= again:
                assert time.monotonic() < deadline, (len(seen), sorted(refused - again))
                for r in a.poll(0.5):
                    if r.offset in answered:
                        again.add(r.offset)
                    seen.add(r.offset)
                    a.acknowledge(r, ACCEPT)
            assert not confirmed & again, sorted(confirmed & again)
        finally:
            a.close()
    finally:
        b.stop()
