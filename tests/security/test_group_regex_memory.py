"""Issue 36, finding 3: regex memory was never freed. Ten 20 MB regexes (valid RE2) grew the broker
from 58 to 496 MB and it stayed there after every member left: the compile cache kept 256 patterns
whatever their size, the coordinator's matches cache up to 10,000 keys, and no bound held a regex
or a member record. Kafka refuses a member record larger than the offsets topic's maximum record
size (the append's MESSAGE_TOO_LARGE, answered UNKNOWN_SERVER_ERROR) and keeps a regex only while a
member uses it; so does oncelog, and its compile cache is bounded by the patterns' total length.

In-process broker over real sockets (its clock the test's, for the session expiry)."""
from __future__ import annotations

import asyncio
import time

import pytest
from test_regex_describe import Member

from oncelog.broker.config import BrokerConfig
from oncelog.core.groups import subscriptions
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing.in_process import InProcessBroker
from oncelog.testing.raw_client import AsyncRawConnection

SESSION_MS = 45000


class Clock:
    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


@pytest.fixture
async def plain(tmp_path):
    clock = Clock()
    broker = InProcessBroker(BrokerConfig({"log.dirs": str(tmp_path / "data"), "node.id": "1",
                                           "listeners": "PLAINTEXT://127.0.0.1:0",
                                           "log.retention.check.interval.ms": "50"}), clock=clock)
    host, port = (await broker.start())[:2]
    conns: list[AsyncRawConnection] = []

    async def connect() -> AsyncRawConnection:
        conns.append(await AsyncRawConnection.open(host, port))
        return conns[-1]

    yield broker, connect, clock
    for c in conns:
        await c.close()
    await broker.stop()


def big_regex(n: int, tag: str) -> str:
    """A valid RE2 pattern of about `n` characters: a character class (what the attack sent)."""
    return f"{tag}-[" + "a" * n + "]"


async def poll(check, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_a_member_record_above_the_offsets_topics_maximum_is_refused_before_anything(plain):
    broker, connect, _clock = plain
    huge = big_regex(2_000_000, "huge")
    m = Member(await connect(), "g")
    assert await m.heartbeat(subscribed_topic_regex=huge) == E.UNKNOWN_SERVER_ERROR
    assert huge not in subscriptions.cached_patterns()         # never compiled
    assert broker.groups.consumer.group("g") is None            # nothing stored
    # a megabyte of topic names is the same record
    names = tuple(f"{i:05d}-" + "n" * 240 for i in range(5000))
    assert await m.heartbeat(subscribed_topic_names=names) == E.UNKNOWN_SERVER_ERROR
    assert broker.groups.consumer.group("g") is None
    # within the limit, the same member joins
    assert await m.heartbeat(subscribed_topic_regex=big_regex(100_000, "ok")) == E.NONE
    r = await m.conn.call(ApiKey.CONSUMER_GROUP_DESCRIBE, 1, group_ids=("g",), include_authorized_operations=False)
    assert int(r.groups[0].error_code) == E.NONE and len(r.groups[0].members) == 1


async def test_regexes_are_freed_with_their_last_member(plain):
    broker, connect, clock = plain
    coordinator = broker.groups.consumer
    shared, alone, fenced = big_regex(300_000, "shared"), big_regex(300_000, "alone"), big_regex(300_000, "fenced")
    a, b = Member(await connect(), "g1"), Member(await connect(), "g2")
    c, d = Member(await connect(), "g2"), Member(await connect(), "g3")
    for m, regex in ((a, shared), (b, shared), (c, alone), (d, fenced)):
        assert await m.heartbeat(subscribed_topic_regex=regex) == E.NONE
    for m in (a, b, c, d):
        assert await m.heartbeat() == E.NONE      # the regexes are resolved
    assert {shared, alone, fenced} <= set(coordinator._regexes)
    assert {shared, alone, fenced} <= set(subscriptions.cached_patterns())
    # a leaves: b in another group still uses the shared regex
    assert await a.heartbeat(-1) == E.NONE
    assert shared in coordinator._regexes and shared in subscriptions.cached_patterns()
    # c changes its regex: the old one goes
    assert await c.heartbeat(subscribed_topic_regex="small-.*") == E.NONE
    assert alone not in coordinator._regexes and alone not in subscriptions.cached_patterns()
    assert await b.heartbeat(-1) == E.NONE
    assert shared not in coordinator._regexes and shared not in subscriptions.cached_patterns()
    # d stops heartbeating: fenced after its session, and its regex goes with it
    clock.t += (SESSION_MS + 1000) / 1000
    assert await poll(lambda: fenced not in coordinator._regexes)
    assert fenced not in subscriptions.cached_patterns()


def test_no_compiled_pattern_is_kept_out_of_reach():
    """pyre2's re2.compile keeps the last 128 patterns in an lru_cache of its own, whatever their
    size (ten 1 MB regexes stayed after their members left); patterns are compiled around it."""
    import re2
    before = re2._Regexp._make.cache_info().currsize
    pattern = big_regex(200_000, "reach")
    subscriptions.compile_regex(pattern)
    subscriptions.forget(pattern)
    assert re2._Regexp._make.cache_info().currsize == before
    assert pattern not in subscriptions.cached_patterns()


def test_the_compile_cache_is_bounded_by_the_patterns_total_length():
    cache = subscriptions._CompileCache(max_patterns=100, max_chars=1_000_000)
    for i in range(10):
        cache.get(big_regex(300_000, f"p{i}"))
        assert cache.chars <= 1_000_000 and len(cache.entries) <= 3
    cache.get(big_regex(2_000_000, "one-off"))             # larger than the whole cache: not kept
    assert cache.chars <= 1_000_000 and not any(p.startswith("one-off") for p in cache.entries)
    assert len(subscriptions.cached_patterns()) <= subscriptions.CACHE_PATTERNS
