"""Dead-letter topics of share groups (KIP-1191) against an in-process broker over real sockets: a
record a member REJECTs, or one archived at the delivery count limit, is written to the group's
dead-letter topic with Kafka's `__dlq.errors.*` headers, once, and left ARCHIVED; off by default
(`share.version` 1, or no topic named); the group configs are validated; the topic's consent
(`errors.deadletterqueue.group.enable`), the cluster's name prefix and auto-creation are Kafka's.
States are waited for by polling with a deadline, never by sleeping."""
from __future__ import annotations

import time
import uuid

import pytest
from test_share_group_protocol import ACCEPT, REJECT, RELEASE, call, offsets, share  # noqa: F401 - fixture

from oncelog.client.aio.consumer import AIOConsumer
from oncelog.client.types import TopicPartition
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.storage import failpoints as storage_failpoints

DLQ = "dlq.g"
REJECTED = "Offset rejected by client."
PAST_LIMIT = "Offset delivery count exceeded the threshold."


@pytest.fixture
def sb(share):  # noqa: F811 - test_share_group_protocol's broker, its clock and helpers
    return share


async def features(sb, level: int) -> None:
    mod = entities.module(ApiKey.UPDATE_FEATURES, 1, "request")
    r = await call(await sb["conn"](), ApiKey.UPDATE_FEATURES, 1, timeout=10000, validate_only=False,
                   feature_updates=(entities.make(mod.FeatureUpdateKey, feature="share.version",
                                                  max_version_level=level, upgrade_type=1 if level >= 1 else 2),))
    assert int(r.error_code) == E.NONE, r
    await until(lambda: sb["broker"].security.state.features.level("share.version") == level, "the feature level")


async def create_topic(sb, name: str, partitions: int = 1, **configs: str) -> uuid.UUID:
    ct = entities.nested(ApiKey.CREATE_TOPICS, 7, "request", "CreatableTopic")
    cc = entities.nested(ApiKey.CREATE_TOPICS, 7, "request", "CreatableTopicConfig")
    r = await call(await sb["conn"](), ApiKey.CREATE_TOPICS, 7, timeout=10000, validate_only=False,
                   topics=(ct(name=name, num_partitions=partitions, replication_factor=1, assignments=(),
                              configs=tuple(cc(name=k, value=v) for k, v in configs.items())),))
    assert r.topics[0].error_code.value == 0, r
    return r.topics[0].topic_id


async def alter(sb, resource_type: int, name: str, **configs: str) -> tuple[int, str | None]:
    res = entities.nested(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "request", "AlterConfigsResource")
    cfg = entities.nested(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "request", "AlterableConfig")
    r = await call(await sb["conn"](), ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, validate_only=False, resources=(res(
        resource_type=resource_type, resource_name=name, configs=tuple(
            cfg(name=k, config_operation=0, value=v) for k, v in configs.items())),))
    return r.responses[0].error_code.value, r.responses[0].error_message


async def group_dlq(sb, group: str = "g", topic: str = DLQ, **more: str) -> None:
    assert await alter(sb, 32, group, **{"share.auto.offset.reset": "earliest",
                                            "errors.deadletterqueue.topic.name": topic, **more}) == (E.NONE, None)


async def until(predicate, what: str, timeout_s: float = 20) -> None:
    import asyncio
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"waited {timeout_s}s for {what}"
        await asyncio.sleep(0.02)


async def read(sb, topic: str, at_least: int, partition: int = 0, timeout_s: float = 20) -> list:
    """Every record of `topic`'s partition, once there are `at_least`."""
    host, port = sb["address"]
    async with AIOConsumer({"bootstrap.servers": f"{host}:{port}", "auto.offset.reset": "earliest"}) as c:
        tp = TopicPartition(topic, partition)
        c.assign([tp])
        c.seek(tp, 0)
        out: list = []
        deadline = time.monotonic() + timeout_s
        while len(out) < at_least:
            assert time.monotonic() < deadline, f"{topic}: {len(out)} records, waited for {at_least}"
            out += await c.poll(0.1)
        return out


def end_offset(sb, topic: str, partition: int = 0) -> int:
    p = sb["broker"].logs.get_partition(topic, partition)
    return -1 if p is None else p.log_end_offset


def headers(r) -> dict[str, str]:
    return {k: v.decode() for k, v in r.headers}


def dead_letter_state(sb):
    """(pending dead letters, written, given up) over the broker's share-partitions."""
    s = sb["broker"].groups.share
    counts = s.counts()
    return sum(len(sp.dead_letters()) for sp in s.partitions.values()), counts.dead_lettered, counts.dead_letter_failed


async def rejecting(sb, n: int = 5) -> tuple:
    """A topic `t` with `n` records, a member that holds all of them."""
    tid = await sb["topic"]("t", records=n)
    a = await sb["sharer"]("g", tid)
    code, got = await a.fetch(epoch=0, max_records=100)
    assert code == E.NONE and offsets(got[0][2]) == list(range(n))
    return tid, a


async def test_a_rejected_record_is_written_to_the_dead_letter_topic_with_kafkas_headers(sb):
    await features(sb, 2)
    await create_topic(sb, DLQ, **{"errors.deadletterqueue.group.enable": "true"})
    await group_dlq(sb)
    _tid, a = await rejecting(sb)
    assert (await a.acknowledge([(0, 4, [ACCEPT, REJECT, ACCEPT, REJECT, ACCEPT])]))[1] == {0: E.NONE}
    records = await read(sb, DLQ, 2)
    assert [headers(r) for r in records] == [
        {"__dlq.errors.topic": "t", "__dlq.errors.partition": "0", "__dlq.errors.offset": str(o),
         "__dlq.errors.group": "g", "__dlq.errors.delivery.count": "1", "__dlq.errors.message": REJECTED}
        for o in (1, 3)]
    assert all(r.key is None and r.value is None for r in records)   # errors.deadletterqueue.copy.record.enable=false
    await until(lambda: dead_letter_state(sb) == (0, 2, 0), "the dead letters marked written")
    assert end_offset(sb, DLQ) == 2
    # the originals stay archived: nothing comes back, and the share-partition moved past them
    assert (await a.fetch(max_records=100))[1] == {}
    sp = next(iter(sb["broker"].groups.share.partitions.values()))
    assert sp.start == 5


async def test_copy_record_enable_copies_the_key_and_value(sb):
    await features(sb, 2)
    await create_topic(sb, DLQ, **{"errors.deadletterqueue.group.enable": "true"})
    await group_dlq(sb, **{"errors.deadletterqueue.copy.record.enable": "true"})
    _tid, a = await rejecting(sb, 3)
    await a.acknowledge([(0, 2, [REJECT])])
    records = await read(sb, DLQ, 3)
    assert [(r.key, r.value, headers(r)["__dlq.errors.offset"]) for r in records] == [
        (None, f"v{o}".encode(), str(o)) for o in range(3)]


async def test_a_record_archived_at_the_delivery_limit_is_dead_lettered(sb):
    # the fixture's group.share.delivery.count.limit is 3; the DLQ topic has 2 partitions: the
    # source partition 0 writes to 0 % 2
    await features(sb, 2)
    await create_topic(sb, DLQ, partitions=2, **{"errors.deadletterqueue.group.enable": "true"})
    await group_dlq(sb)
    _tid, a = await rejecting(sb, 2)
    await a.acknowledge([(0, 1, [RELEASE, ACCEPT])])
    for count in (2, 3):
        code, got = await a.fetch(max_records=100)
        assert got[0][2] == [(0, 0, count)]
        if count == 2:
            await a.acknowledge([(0, 0, [RELEASE])])
    # the third delivery's lock runs out: archived by the limit
    sb["clock"].advance_ms(31000)
    records = await read(sb, DLQ, 1)
    assert headers(records[0])["__dlq.errors.delivery.count"] == "3"
    assert headers(records[0])["__dlq.errors.message"] == PAST_LIMIT
    assert end_offset(sb, DLQ, 1) == 0


async def test_off_by_default(sb):
    await create_topic(sb, DLQ, **{"errors.deadletterqueue.group.enable": "true"})
    await group_dlq(sb)   # share.version is 1: the group's topic is not used
    _tid, a = await rejecting(sb, 2)
    await a.acknowledge([(0, 1, [REJECT])])
    assert dead_letter_state(sb) == (0, 0, 0)   # archived at once: nothing owed, nothing to write
    sp = next(iter(sb["broker"].groups.share.partitions.values()))
    assert sp.start == 2
    # share.version 2 without a topic named: the same
    await features(sb, 2)
    assert await alter(sb, 32, "g", **{"errors.deadletterqueue.topic.name": ""}) == (E.NONE, None)
    await sb["produce"]("t", 2)
    code, got = await a.fetch(max_records=100)
    assert offsets(got[0][2]) == [2, 3]
    await a.acknowledge([(2, 3, [REJECT])])
    assert dead_letter_state(sb) == (0, 0, 0) and sp.start == 4 and end_offset(sb, DLQ) == 0


@pytest.mark.parametrize(("name", "value"), [
    ("errors.deadletterqueue.topic.name", "__consumer_offsets"),
    ("errors.deadletterqueue.topic.name", "__dlq"),
    ("errors.deadletterqueue.topic.name", "dlq/bad name"),
    ("errors.deadletterqueue.copy.record.enable", "yes"),
    ("errors.deadletterqueue.topic.name.prefix", "x."),    # a broker config, not a group's
])
async def test_group_configs_are_validated(sb, name, value):
    code, message = await alter(sb, 32, "g", **{name: value})
    assert code == E.INVALID_CONFIG, message
    assert sb["broker"].groups.share.group_config("g", "errors.deadletterqueue.topic.name") == ""


async def test_a_topic_that_does_not_consent_or_misses_the_prefix_archives_without_a_dead_letter(sb):
    await features(sb, 2)
    await create_topic(sb, DLQ)   # no errors.deadletterqueue.group.enable
    await create_topic(sb, "orders.dead", **{"errors.deadletterqueue.group.enable": "true"})
    await group_dlq(sb)
    _tid, a = await rejecting(sb, 2)
    await a.acknowledge([(0, 0, [REJECT])])
    await until(lambda: dead_letter_state(sb) == (0, 0, 1), "the dead letter given up")
    # the prefix (the cluster's errors.deadletterqueue.topic.name.prefix, dlq. by default)
    await group_dlq(sb, topic="orders.dead")
    await a.acknowledge([(1, 1, [REJECT])])
    await until(lambda: dead_letter_state(sb) == (0, 0, 2), "the dead letter given up")
    assert end_offset(sb, DLQ) == 0 and end_offset(sb, "orders.dead") == 0
    sp = next(iter(sb["broker"].groups.share.partitions.values()))
    assert sp.start == 2
    # the prefix is a dynamic cluster config: without it, orders.dead takes them
    assert await alter(sb, 4, "", **{"errors.deadletterqueue.topic.name.prefix": ""}) == (E.NONE, None)
    await sb["produce"]("t", 1)
    code, got = await a.fetch(max_records=100)
    await a.acknowledge([(2, 2, [REJECT])])
    records = await read(sb, "orders.dead", 1)
    assert headers(records[0])["__dlq.errors.offset"] == "2"


async def test_a_missing_topic_is_created_only_when_the_cluster_allows_it(sb):
    await features(sb, 2)
    await group_dlq(sb)
    _tid, a = await rejecting(sb, 2)
    await a.acknowledge([(0, 0, [REJECT])])
    await until(lambda: dead_letter_state(sb) == (0, 0, 1), "the dead letter given up")
    assert DLQ not in sb["broker"].logs.topics
    assert await alter(sb, 4, "", **{"errors.deadletterqueue.auto.create.topics.enable": "true"}) == (E.NONE, None)
    await a.acknowledge([(1, 1, [REJECT])])
    records = await read(sb, DLQ, 1)
    assert headers(records[0])["__dlq.errors.offset"] == "1"
    assert sb["broker"].logs.topic_config(DLQ)["errors.deadletterqueue.group.enable"] is True


@pytest.fixture
def failpoints():
    yield storage_failpoints.configure
    storage_failpoints.configure(None)


async def test_dead_letters_owed_at_a_restart_are_written_once(sb, failpoints):
    """A clean stop while dead letters are owed (the dead-letter partition's disk is full: a
    passing failure, tried again) leaves them in the state; the next start writes them, without
    waiting for a consumer."""
    await features(sb, 2)
    await create_topic(sb, DLQ, **{"errors.deadletterqueue.group.enable": "true"})
    await group_dlq(sb)
    _tid, a = await rejecting(sb, 3)
    failpoints(f"enospc:log:match={DLQ}-0:times=0")
    await a.acknowledge([(0, 2, [REJECT, ACCEPT, REJECT])])
    await until(lambda: sb["broker"].share_dlq._retry, "a failed write")
    assert dead_letter_state(sb)[0] == 2 and end_offset(sb, DLQ) == 0
    failpoints(None)
    await sb["restart"]()
    records = await read(sb, DLQ, 2)
    assert [headers(r)["__dlq.errors.offset"] for r in records] == ["0", "2"]
    await until(lambda: dead_letter_state(sb) == (0, 2, 0), "the dead letters marked written")
    assert end_offset(sb, DLQ) == 2


async def test_dead_letters_waiting_for_their_topic_are_bounded_by_the_in_flight_records(sb, failpoints):
    """A flood of REJECTs while the dead-letter partition cannot be written: what is owed stays
    within group.share.partition.max.record.locks (ARCHIVING holds the share-partition's start),
    the next fetch acquires nothing new, and once the partition takes writes again every dead
    letter is written, once."""
    import dataclasses
    coordinator = sb["broker"].groups.share
    coordinator.config = dataclasses.replace(coordinator.config, partition_max_record_locks=10)   # (read when loaded)
    await features(sb, 2)
    await create_topic(sb, DLQ, **{"errors.deadletterqueue.group.enable": "true"})
    await group_dlq(sb)
    tid = await sb["topic"]("t", records=30)
    a = await sb["sharer"]("g", tid)
    code, got = await a.fetch(epoch=0, max_records=100, mode=1, version=2)
    assert offsets(got[0][2]) == list(range(10))   # the in-flight bound
    failpoints(f"enospc:log:match={DLQ}-0:times=0")
    await a.acknowledge([(0, 9, [REJECT])])
    await until(lambda: sb["broker"].share_dlq._retry, "a failed write")
    assert dead_letter_state(sb)[0] == 10
    assert (await a.fetch(max_records=100, mode=1, version=2))[1] == {}   # nothing new while 10 are owed
    failpoints(None)
    sb["broker"].share_dlq._retry.clear()   # (its pause is wall-clock time: not waited for here)
    records = await read(sb, DLQ, 10)
    assert [int(headers(r)["__dlq.errors.offset"]) for r in records] == list(range(10))
    await until(lambda: dead_letter_state(sb) == (0, 10, 0), "the dead letters marked written")
    code, got = await a.fetch(max_records=100, mode=1, version=2)
    assert offsets(got[0][2]) == list(range(10, 20))
    assert end_offset(sb, DLQ) == 10


async def test_an_offsets_reset_keeps_the_dead_letters_owed(sb, failpoints):
    """AlterShareGroupOffsets starts a share-partition afresh; the records it rejected stay
    rejected: their dead letters are still written, once."""
    from test_share_group_offsets import alter as alter_offsets
    await features(sb, 2)
    await create_topic(sb, DLQ, **{"errors.deadletterqueue.group.enable": "true"})
    await group_dlq(sb)
    _tid, a = await rejecting(sb, 5)
    failpoints(f"enospc:log:match={DLQ}-0:times=0")
    await a.acknowledge([(0, 4, [REJECT, REJECT, ACCEPT, REJECT, ACCEPT])])
    await until(lambda: sb["broker"].share_dlq._retry, "a failed write")
    assert await a.heartbeat(epoch=-1) == E.NONE
    assert await alter_offsets(await sb["conn"](), "g", {("t", 0): 0}) == (E.NONE, [(("t", 0), E.NONE)])
    sp = next(iter(sb["broker"].groups.share.partitions.values()))
    assert sp.start == 0 and [d.offset for d in sp.dead_letters()] == [0, 1, 3]
    failpoints(None)
    sb["broker"].share_dlq._retry.clear()
    records = await read(sb, DLQ, 3)
    assert [int(headers(r)["__dlq.errors.offset"]) for r in records] == [0, 1, 3]
    await until(lambda: dead_letter_state(sb)[0] == 0, "the dead letters written")
    assert end_offset(sb, DLQ) == 3
