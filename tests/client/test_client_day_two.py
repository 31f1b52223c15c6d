"""What an application developer coming from Kafka's clients expects of oncelog's, against a real
broker (issue 39): `auto.offset.reset` defaults to latest, a misspelt setting is refused naming
the nearest known one (confluent-kafka's "No such configuration property"), create_topics and delete_topics
return a future per topic, the consumer pauses, resumes and unsubscribes, and the asyncio
consumer iterates with `async for`."""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time

import pytest

from oncelog.client import AdminClient, Consumer, Producer, ShareConsumer, config_keys
from oncelog.client.aio.admin import AIOAdminClient
from oncelog.client.aio.admin_base import AdminError
from oncelog.client.aio.consumer import AIOConsumer
from oncelog.client.aio.share_consumer import AIOShareConsumer
from oncelog.client.errors import ConfigError
from oncelog.client.types import TopicPartition
from oncelog.protocol.errors import ErrorCode

NOWHERE = "127.0.0.1:1"   # refused configurations fail before any connection


def _produce(bootstrap: str, topic: str, values: list[bytes], partition: int = 0) -> None:
    with Producer({"bootstrap.servers": bootstrap}) as p:
        for v in values:
            p.send(topic, v, partition=partition)
        p.flush(60)


def _create(bootstrap: str, topic: str, partitions: int = 1) -> None:
    with AdminClient({"bootstrap.servers": bootstrap}) as a:
        a.create_topics([topic], num_partitions=partitions)[topic].result(60)


def _poll_until(c: Consumer, want: int, timeout_s: float = 30) -> list:
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += c.poll(0.5)
    return got


# ------------------------------------------------------------------ unknown settings refused

@pytest.mark.parametrize("make, key, near", [
    (lambda cfg: Consumer(cfg), "enable.auto.comit", "enable.auto.commit"),
    (lambda cfg: Producer(cfg), "lingr.ms", "linger.ms"),
    (lambda cfg: AdminClient(cfg), "request.timout.ms", "request.timeout.ms"),
    (lambda cfg: AIOConsumer(cfg), "isolaton.level", "isolation.level"),
    (lambda cfg: AIOAdminClient(cfg), "securty.protocol", "security.protocol"),
    (lambda cfg: ShareConsumer(cfg), "share.acknowledgment.mode", "share.acknowledgement.mode"),
    (lambda cfg: AIOShareConsumer(cfg), "max.pol.records", "max.poll.records"),
])
def test_a_misspelt_setting_is_refused_naming_the_nearest(make, key, near):
    with pytest.raises(ConfigError) as refused:
        make({"bootstrap.servers": NOWHERE, "group.id": "g", key: "5"})
    assert str(refused.value) == f'No such configuration property: "{key}" (did you mean "{near}"?)'


def test_a_setting_of_another_client_is_known_and_has_no_effect(caplog):
    # as librdkafka: one dict for every client of an application is not a typo
    with pytest.raises(ConfigError, match="No such configuration property"):
        Consumer({"bootstrap.servers": NOWHERE, "no.such.thing": "1"})
    with caplog.at_level(logging.WARNING, logger="oncelog.client"):
        config_keys.check({"bootstrap.servers": NOWHERE, "linger.ms": "5"}, "consumer")
    assert "linger.ms is not a consumer property" in caplog.text


# ------------------------------------------------------------------ auto.offset.reset

@pytest.mark.processes
def test_a_consumer_without_a_position_starts_at_the_end(shared_broker, unique_topic):
    """Kafka's default, latest: a new group, or an assignment without offsets, reads what is
    produced from then on, not what was there (the README's group snippet printed old records)."""
    b = shared_broker.bootstrap
    _create(b, unique_topic)
    _produce(b, unique_topic, [b"old-1", b"old-2"])
    with Consumer({"bootstrap.servers": b}) as assigned, \
            Consumer({"bootstrap.servers": b, "group.id": unique_topic}) as grouped, \
            Consumer({"bootstrap.servers": b, "auto.offset.reset": "earliest"}) as earliest:
        assigned.assign([TopicPartition(unique_topic, 0)])
        earliest.assign([TopicPartition(unique_topic, 0)])
        grouped.subscribe([unique_topic])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (assigned.position(TopicPartition(unique_topic, 0)) is None
                                               or not grouped.assignment()):
            assert assigned.poll(0.2) == [] and grouped.poll(0.2) == []
        while time.monotonic() < deadline and grouped.position(TopicPartition(unique_topic, 0)) is None:
            assert grouped.poll(0.2) == []
        _produce(b, unique_topic, [b"new"])
        assert [r.value for r in _poll_until(assigned, 1)] == [b"new"]
        assert [r.value for r in _poll_until(grouped, 1)] == [b"new"]
        assert [r.value for r in _poll_until(earliest, 3)] == [b"old-1", b"old-2", b"new"]


# ------------------------------------------------------------------ create_topics futures

@pytest.mark.processes
def test_create_and_delete_topics_return_a_future_per_topic(shared_broker, unique_topic):
    b = shared_broker.bootstrap
    with AdminClient({"bootstrap.servers": b}) as a:
        a.create_topics([f"{unique_topic}-taken"])[f"{unique_topic}-taken"].result(60)
        futures = a.create_topics([f"{unique_topic}-new", f"{unique_topic}-taken"], num_partitions=2)
        assert set(futures) == {f"{unique_topic}-new", f"{unique_topic}-taken"}
        assert all(isinstance(f, concurrent.futures.Future) for f in futures.values())
        assert futures[f"{unique_topic}-new"].result(60) is None
        with pytest.raises(AdminError) as taken:
            futures[f"{unique_topic}-taken"].result(60)
        assert taken.value.code == ErrorCode.TOPIC_ALREADY_EXISTS
        assert a.list_topics()[f"{unique_topic}-new"] == 2
        # exist_ok: an existing topic's future succeeds
        assert a.create_topics([f"{unique_topic}-taken"], exist_ok=True)[f"{unique_topic}-taken"].result(60) is None

        # delete_topics likewise (confluent-kafka's): a future per topic, the unknown one refused
        gone = a.delete_topics([f"{unique_topic}-new", f"{unique_topic}-never"])
        assert set(gone) == {f"{unique_topic}-new", f"{unique_topic}-never"}
        assert gone[f"{unique_topic}-new"].result(60) is None
        with pytest.raises(AdminError) as unknown:
            gone[f"{unique_topic}-never"].result(60)
        assert unknown.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert f"{unique_topic}-new" not in a.list_topics() and f"{unique_topic}-taken" in a.list_topics()


# ------------------------------------------------------------------ pause, resume, unsubscribe

@pytest.mark.processes
def test_a_paused_partition_is_not_read_until_resumed(shared_broker, unique_topic):
    b = shared_broker.bootstrap
    _create(b, unique_topic, partitions=2)
    _produce(b, unique_topic, [b"a%d" % i for i in range(5)], partition=0)
    _produce(b, unique_topic, [b"b%d" % i for i in range(5)], partition=1)
    p0, p1 = TopicPartition(unique_topic, 0), TopicPartition(unique_topic, 1)
    with Consumer({"bootstrap.servers": b, "auto.offset.reset": "earliest"}) as c:
        c.assign([p0, p1])
        first = c.poll(10, max_records=1)      # fetched both partitions; the rest is buffered
        assert len(first) == 1
        c.pause([p0])
        assert c.paused() == [p0]
        got = _poll_until(c, 5 if first[0].partition == 0 else 4, timeout_s=5)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:     # nothing of p0 comes while paused, buffered or not
            got += c.poll(0.3)
        assert {r.partition for r in got} == {1}
        c.resume([p0])
        assert c.paused() == []
        rest = _poll_until(c, 5 if first[0].partition == 1 else 4)
        # p0's records after the first one returned, each once, in order (buffered ones fetched again)
        seen = [r.offset for r in [*first, *rest] if r.partition == 0]
        assert seen == list(range(5))
        with pytest.raises(Exception, match="not assigned"):
            c.pause([TopicPartition(unique_topic, 7)])


@pytest.mark.processes
def test_unsubscribe_leaves_the_group_committing_and_revoking(shared_broker, unique_topic):
    b = shared_broker.bootstrap
    _create(b, unique_topic)
    _produce(b, unique_topic, [b"x%d" % i for i in range(3)])
    revoked: list = []
    cfg = {"bootstrap.servers": b, "group.id": unique_topic, "auto.offset.reset": "earliest"}
    with Consumer(cfg) as c:
        c.subscribe([unique_topic], on_revoke=lambda _c, parts: revoked.extend(parts))
        assert len(_poll_until(c, 3)) == 3
        c.unsubscribe()
        assert c.assignment() == [] and revoked == [TopicPartition(unique_topic, 0)]
        assert c.poll(0.5) == []
        # assign may follow, as after Kafka's unsubscribe
        c.assign([TopicPartition(unique_topic, 0, 1)])
        assert [r.offset for r in _poll_until(c, 2)] == [1, 2]
    with Consumer(cfg) as again:   # what poll returned was committed on the way out
        got = again.committed([TopicPartition(unique_topic, 0)], timeout=30)
        assert got[0].offset == 3, got


# ------------------------------------------------------------------ async for

@pytest.mark.processes
async def test_the_asyncio_consumer_iterates_with_async_for(shared_broker, unique_topic):
    b = shared_broker.bootstrap
    await asyncio.to_thread(_create, b, unique_topic)
    await asyncio.to_thread(_produce, b, unique_topic, [b"r%d" % i for i in range(7)])
    values = []
    async with AIOConsumer({"bootstrap.servers": b, "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition(unique_topic, 0)])

        async def read() -> None:
            async for record in c:
                values.append(record.value)
                if len(values) == 7:
                    break
        await asyncio.wait_for(read(), 30)
    assert values == [b"r%d" % i for i in range(7)]
