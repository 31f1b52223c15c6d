"""KIP-848 consumer groups seen from outside, as Kafka 4's group coordinator answers them:
hand-built ConsumerGroupHeartbeat / ConsumerGroupDescribe / OffsetCommit / OffsetFetch /
ListGroups / DescribeGroups / JoinGroup requests over real sockets to an in-process Broker with
real files. The broker's clock is a test clock where session and rebalance timeouts matter.

Bad input gets Kafka's error code and changes nothing: after each refused heartbeat the group's
description and its stored file are what they were."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from test_dedup_raw import Conn
from test_group_protocol import Clock, Member, create_topic

from oncelog.broker.config import BrokerConfig
from oncelog.protocol import entities
from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing.in_process import InProcessBroker

HB, DESCRIBE_CG, LIST, DESCRIBE, COMMIT, FETCH, JOIN, DELETE_GROUPS = 68, 69, 16, 15, 8, 9, 11, 42
SESSION_MS, INTERVAL_MS = 45000, 5000


class Consumer:
    """One KIP-848 member: what it sent and what it was told."""

    def __init__(self, conn: Conn, group: str, topics=("t",), instance: str | None = None,
                 member_id: str | None = None) -> None:
        self.conn, self.group, self.topics, self.instance = conn, group, tuple(topics), instance
        self.member_id = member_id if member_id is not None else str(uuid.uuid4())
        self.epoch = 0
        self.owned: dict[uuid.UUID, set[int]] = {}
        self.interval = -1

    async def call(self, api: int, version: int, **fields):
        req = entities.make(entities.entity_class(api, version, "request"), **fields)
        return await self.conn.kio(req, entities.entity_class(api, version, "response"))

    async def heartbeat(self, epoch: int | None = None, owned=None, version: int = 1, **fields):
        """A heartbeat; `owned` defaults to what it owns (a join sends none). Applies the answer."""
        epoch = self.epoch if epoch is None else epoch
        tp = entities.nested(HB, version, "request", "TopicPartitions")
        if epoch == 0:
            fields = {"rebalance_timeout": 30000, "subscribed_topic_names": self.topics, **fields}
            owned = {}
        owned = self.owned if owned is None else owned
        r = await self.call(HB, version, group_id=self.group, member_id=self.member_id, member_epoch=epoch,
                            instance_id=self.instance,
                            topic_partitions=tuple(tp(topic_id=t, partitions=tuple(sorted(ps)))
                                                   for t, ps in owned.items() if ps), **fields)
        code = r.error_code.value
        if code == E.NONE and epoch >= 0:
            self.epoch, self.interval = int(r.member_epoch), int(r.heartbeat_interval.total_seconds() * 1000)
            if r.assignment is not None:
                self.owned = {t.topic_id: set(t.partitions) for t in r.assignment.topic_partitions}
        return code

    def partitions(self) -> set[int]:
        return {p for ps in self.owned.values() for p in ps}


@pytest.fixture
async def cluster(tmp_path):
    clock = Clock()
    config = {"log.dirs": str(tmp_path / "data"), "listeners": "PLAINTEXT://127.0.0.1:0", "node.id": "1",
              "offsets.retention.check.interval.ms": "1", "offsets.retention.minutes": "60"}
    state = {"broker": InProcessBroker(BrokerConfig(config), clock=clock)}
    host, port = (await state["broker"].start())[:2]
    state["address"] = (host, port)
    conns: list[Conn] = []

    async def consumer(group: str, **kw) -> Consumer:
        conn = await Conn.open(*state["address"])
        conns.append(conn)
        return Consumer(conn, group, **kw)

    async def restart() -> None:
        for c in conns:
            await c.close()
        conns.clear()
        await state["broker"].stop()
        state["broker"] = InProcessBroker(BrokerConfig({**config, "listeners": f"PLAINTEXT://127.0.0.1:{port}"}),
                                          clock=clock)
        await state["broker"].start()

    admin = await consumer("admin")
    member = Member(admin.conn, "admin")
    for topic, n in (("t", 6), ("u", 2), ("logs-a", 1), ("logs-b", 1)):
        await create_topic(member, topic, n)
    yield state, clock, consumer, restart
    for c in conns:
        await c.close()
    await state["broker"].stop()


async def describe(c: Consumer, group: str | None = None):
    r = await c.call(DESCRIBE_CG, 1, group_ids=(group or c.group,), include_authorized_operations=False)
    return r.groups[0]


def stored(broker, group: str) -> bytes:
    """The group's files: its offsets and its record log (`storage.group_records`)."""
    d = Path(broker.config.log_dirs[0]) / "__consumer_offsets"
    return b"".join(p.read_bytes() if p.exists() else b"-" for p in (d / f"{group}.json", d / f"{group}.records"))


async def settle(*members: Consumer, rounds: int = 6) -> None:
    """Heartbeats until nothing changes: revocations acknowledged, freed partitions taken."""
    for _ in range(rounds):
        for m in members:
            assert await m.heartbeat() == E.NONE


async def stable_trio(consumer, group: str = "g") -> list[Consumer]:
    members = [await consumer(group) for _ in range(3)]
    for m in members:
        assert await m.heartbeat(0) == E.NONE
    await settle(*members)
    assert sorted(p for m in members for p in m.partitions()) == list(range(6))
    return members


# ------------------------------------------------------------------ joining, epochs, assignment

async def test_members_join_and_split_the_partitions_revoking_before_anything_is_given(cluster):
    _state, _clock, consumer, _restart = cluster
    a, b = await consumer("g"), await consumer("g")
    assert await a.heartbeat(0) == E.NONE
    assert (a.epoch, a.partitions(), a.interval) == (1, set(range(6)), INTERVAL_MS)
    assert await b.heartbeat(0) == E.NONE
    assert (b.epoch, b.partitions()) == (2, set())         # a still owns everything
    assert await a.heartbeat() == E.NONE
    assert (a.epoch, len(a.partitions())) == (1, 3)       # a is asked to give up three, at its epoch
    d = await describe(a)
    assert (d.group_state, d.group_epoch, d.assignment_epoch) == ("Reconciling", 2, 2)
    assert await b.heartbeat() == E.NONE
    assert b.partitions() == set()                        # not before a has let go of them
    assert await a.heartbeat() == E.NONE                  # reports only the three it kept
    assert a.epoch == 2
    assert await b.heartbeat() == E.NONE
    assert (b.epoch, b.partitions()) == (2, set(range(6)) - a.partitions())
    d = await describe(a)
    assert d.group_state == "Stable"
    assert {m.member_id: m.member_epoch for m in d.members} == {a.member_id: 2, b.member_id: 2}


async def test_a_lost_answer_is_survived_with_the_previous_epoch(cluster):
    _state, _clock, consumer, _restart = cluster
    a, b = await consumer("g"), await consumer("g")
    assert await a.heartbeat(0) == E.NONE and await b.heartbeat(0) == E.NONE
    assert await a.heartbeat() == E.NONE and await a.heartbeat() == E.NONE
    assert a.epoch == 2
    # the answer that moved a to epoch 2 is lost: a comes back at epoch 1 with what it kept
    assert await a.heartbeat(epoch=1) == E.NONE
    assert a.epoch == 2
    # but not with an epoch it never had, nor with partitions it no longer has
    assert await a.heartbeat(epoch=3) == E.FENCED_MEMBER_EPOCH
    t = next(iter(a.owned))
    assert await a.heartbeat(epoch=1, owned={t: set(range(6))}) == E.FENCED_MEMBER_EPOCH


async def test_subscription_by_regex_follows_the_topics(cluster):
    state, _clock, consumer, _restart = cluster
    a = await consumer("g", topics=())
    assert await a.heartbeat(0, subscribed_topic_names=None, subscribed_topic_regex="logs-.*") == E.NONE
    assert a.partitions() == set()                 # a new regex is resolved after the heartbeat
    assert await a.heartbeat() == E.NONE
    d = await describe(a)
    assert sorted(t.topic_name for t in d.members[0].assignment.topic_partitions) == ["logs-a", "logs-b"]
    assert d.members[0].subscribed_topic_regex == "logs-.*"
    await create_topic(Member(a.conn, "x"), "logs-c", 2)
    await settle(a)
    d = await describe(a)
    assert sorted(t.topic_name for t in d.members[0].assignment.topic_partitions) == ["logs-a", "logs-b", "logs-c"]
    assert sum(len(ps) for ps in a.owned.values()) == 4


async def test_a_new_regex_is_resolved_after_the_heartbeat_that_brings_it_as_kafka_does(cluster):
    """Kafka resolves a regex that no member of the group subscribed to asynchronously: the
    heartbeat that brings it is answered with the topics named, the regex's topics come at the next
    one. librdkafka's 0045_resubscribe_with_regex (consumer mode) waits for the two steps."""
    _state, _clock, consumer, _restart = cluster
    a = await consumer("g", topics=("u",))
    assert await a.heartbeat(0, subscribed_topic_regex="logs-.*") == E.NONE
    names = {t.topic_id: t.topic_name for t in (await describe(a)).members[0].assignment.topic_partitions}
    assert sorted(names.values()) == ["u"] and a.partitions() == {0, 1}
    first_epoch = a.epoch
    assert await a.heartbeat() == E.NONE
    d = await describe(a)
    assert sorted(t.topic_name for t in d.members[0].assignment.topic_partitions) == ["logs-a", "logs-b", "u"]
    assert a.epoch == first_epoch + 1 and sum(len(ps) for ps in a.owned.values()) == 4
    # a member that joins with a regex the group has resolved is given its share at once
    b = await consumer("g", topics=())
    assert await b.heartbeat(0, subscribed_topic_names=None, subscribed_topic_regex="logs-.*") == E.NONE
    d = await describe(b)
    assert d.group_epoch == a.epoch + 1 and d.assignment_epoch == d.group_epoch
    # after leaving and coming back alone, the regex is new again: two steps once more
    for m in (a, b):
        assert await m.heartbeat(epoch=-1) == E.NONE
    c = await consumer("g", topics=("u",))
    assert await c.heartbeat(0, subscribed_topic_regex="logs-.*") == E.NONE
    assert sum(len(ps) for ps in c.owned.values()) == 2
    assert await c.heartbeat() == E.NONE
    assert sum(len(ps) for ps in c.owned.values()) == 4


# ------------------------------------------------------------------ bad input changes nothing

@pytest.mark.parametrize("case", ["stale epoch", "future epoch", "unknown member", "unknown assignor",
                                  "bad regex", "static id in use", "empty member id", "join without timeout"])
async def test_a_refused_heartbeat_changes_nothing(cluster, case):
    state, _clock, consumer, _restart = cluster
    a, b, c = await stable_trio(consumer)
    assert await c.heartbeat(epoch=-1) == E.NONE  # a moves once more: its epochs 1, 3, 4
    await settle(a, b)
    assert a.epoch == 4
    before, file_before = await describe(a), stored(state["broker"], "g")
    if case == "stale epoch":  # an epoch it had, before its previous one
        code, expected = await a.heartbeat(epoch=1), E.FENCED_MEMBER_EPOCH
    elif case == "future epoch":
        code, expected = await a.heartbeat(epoch=a.epoch + 1), E.FENCED_MEMBER_EPOCH
    elif case == "unknown member":
        code, expected = await (await consumer("g")).heartbeat(epoch=3), E.UNKNOWN_MEMBER_ID
    elif case == "unknown assignor":
        code, expected = await a.heartbeat(server_assignor="sticky"), E.UNSUPPORTED_ASSIGNOR
    elif case == "bad regex":
        code, expected = await a.heartbeat(subscribed_topic_regex="logs-(.*"), E.INVALID_REGULAR_EXPRESSION
    elif case == "static id in use":
        s1, s2 = await consumer("g", instance="i1"), await consumer("g", instance="i1")
        assert await s1.heartbeat(0) == E.NONE
        await settle(a, b, s1)
        before, file_before = await describe(a), stored(state["broker"], "g")
        code, expected = await s2.heartbeat(0), E.UNRELEASED_INSTANCE_ID
    elif case == "empty member id":
        code, expected = await (await consumer("g", member_id="")).heartbeat(0), E.INVALID_REQUEST
    else:
        fresh = await consumer("g")
        code, expected = await fresh.heartbeat(0, rebalance_timeout=-1), E.INVALID_REQUEST
    assert code == expected
    assert await describe(a) == before
    assert stored(state["broker"], "g") == file_before


async def test_a_group_without_members_is_not_found_and_unsupported_protocol_is_said(cluster, tmp_path):
    _state, _clock, consumer, _restart = cluster
    a = await consumer("nobody")
    assert await a.heartbeat(epoch=4) == E.GROUP_ID_NOT_FOUND
    assert (await describe(a)).error_code.value == E.GROUP_ID_NOT_FOUND
    off = InProcessBroker(BrokerConfig({"log.dirs": str(tmp_path / "off"), "listeners": "PLAINTEXT://127.0.0.1:0",
                                        "group.coordinator.rebalance.protocols": "classic"}))
    host, port = (await off.start())[:2]
    try:
        b = Consumer(await Conn.open(host, port), "g")
        assert await b.heartbeat(0) == E.UNSUPPORTED_VERSION
        await b.conn.close()
    finally:
        await off.stop()


# ------------------------------------------------------------------ leaving, timeouts, static members

async def test_a_member_leaving_frees_only_its_partitions(cluster):
    _state, _clock, consumer, _restart = cluster
    a, b, c = await stable_trio(consumer)
    kept = {m.member_id: m.partitions() for m in (a, b)}
    assert await c.heartbeat(epoch=-1) == E.NONE
    await settle(a, b)
    for m in (a, b):
        assert m.partitions() > kept[m.member_id] and len(m.partitions()) == 3
    assert (await describe(a)).group_state == "Stable"


async def test_a_join_sent_without_its_full_fields_after_a_leave_is_taken_as_the_join_it_means(cluster):
    """librdkafka (2.15, 2.16) that subscribes again while its leave is in flight sends its join as
    a plain heartbeat: epoch 0 and the subscription, neither RebalanceTimeoutMs nor TopicPartitions.
    Kafka answers INVALID_REQUEST, fatal for that consumer; oncelog takes it as a join. The same
    join from the member id of a static member that left for a while is still refused."""
    _state, _clock, consumer, _restart = cluster
    a, b, s = await consumer("g"), await consumer("g"), await consumer("g", instance="i1")
    assert await a.heartbeat(0) == E.NONE and await b.heartbeat(0) == E.NONE and await s.heartbeat(0) == E.NONE
    await settle(a, b, s)
    assert await b.heartbeat(epoch=-1) == E.NONE and await s.heartbeat(epoch=-2) == E.NONE

    async def partial_join(c: Consumer):
        return await c.call(HB, 1, group_id="g", member_id=c.member_id, member_epoch=0,
                            subscribed_topic_names=("t",), rebalance_timeout=-1, topic_partitions=None)

    assert (await partial_join(s)).error_code.value == E.INVALID_REQUEST
    r = await partial_join(b)
    assert r.error_code.value == E.NONE and r.assignment is not None
    b.epoch, b.owned = int(r.member_epoch), {t.topic_id: set(t.partitions) for t in r.assignment.topic_partitions}
    await settle(a, b)
    # s keeps its two for its next incarnation; b is given its share back from a
    assert (len(a.partitions()), len(b.partitions())) == (2, 2)
    assert a.partitions() | b.partitions() | s.partitions() == set(range(6))


async def test_a_silent_member_is_fenced_after_its_session_and_one_that_keeps_partitions_after_its_rebalance_timeout(
        cluster):
    state, clock, consumer, _restart = cluster
    a, b, c = await stable_trio(consumer)
    clock.advance_ms(SESSION_MS - 5000)
    await settle(a, b)
    clock.advance_ms(6000)                      # c has been silent for its whole session
    state["broker"].groups.expire()
    await settle(a, b)
    assert sorted(a.partitions() | b.partitions()) == list(range(6))
    assert await c.heartbeat() == E.UNKNOWN_MEMBER_ID
    # a newcomer takes partitions from a and b; b never lets go of its share
    b_had = {t: set(ps) for t, ps in b.owned.items()}
    d = await consumer("g")
    assert await d.heartbeat(0) == E.NONE
    assert await a.heartbeat() == E.NONE and await b.heartbeat(owned=b_had) == E.NONE
    assert b.partitions() < {p for ps in b_had.values() for p in ps}   # asked to give some up
    assert await b.heartbeat(owned=b_had) == E.NONE
    assert await a.heartbeat() == E.NONE                       # a lets go of what it must
    clock.advance_ms(31000)                     # past b's rebalance timeout (30 s)
    state["broker"].groups.expire()
    assert await b.heartbeat() == E.UNKNOWN_MEMBER_ID
    await settle(a, d)
    assert sorted(a.partitions() | d.partitions()) == list(range(6))


async def test_a_static_member_that_leaves_for_a_while_keeps_its_partitions_for_its_next_incarnation(cluster):
    state, clock, consumer, _restart = cluster
    a, b = await consumer("g"), await consumer("g", instance="i1")
    assert await a.heartbeat(0) == E.NONE and await b.heartbeat(0) == E.NONE
    await settle(a, b)
    mine = b.partitions()
    assert await b.heartbeat(epoch=-2) == E.NONE
    await settle(a)
    assert a.partitions() == set(range(6)) - mine            # nobody takes b's partitions
    b2 = await consumer("g", instance="i1")
    assert await b2.heartbeat(0) == E.NONE
    assert b2.partitions() == mine and b2.epoch == (await describe(a)).group_epoch
    assert await b.heartbeat() == E.FENCED_INSTANCE_ID        # the old incarnation is gone
    # gone again, and for good this time: its session runs out and a gets everything
    assert await b2.heartbeat(epoch=-2) == E.NONE
    clock.advance_ms(SESSION_MS + 1000)
    await settle(a)
    state["broker"].groups.expire()
    await settle(a)
    assert a.partitions() == set(range(6))


# ------------------------------------------------------------------ offsets with member epochs

async def commit(c: Consumer, offsets: dict[tuple[str, int], int], epoch: int | None = None, version: int = 9,
                 member_id: str | None = None) -> list[int]:
    t_cls = entities.nested(COMMIT, version, "request", "OffsetCommitRequestTopic")
    p_cls = entities.nested(COMMIT, version, "request", "OffsetCommitRequestPartition")
    topics: dict[str, list] = {}
    for (topic, p), off in offsets.items():
        topics.setdefault(topic, []).append(p_cls(partition_index=p, committed_offset=off, committed_leader_epoch=-1,
                                                  committed_metadata=""))
    r = await c.call(COMMIT, version, group_id=c.group,
                     generation_id_or_member_epoch=c.epoch if epoch is None else epoch,
                     member_id=c.member_id if member_id is None else member_id, group_instance_id=c.instance,
                     topics=tuple(t_cls(name=t, partitions=tuple(ps)) for t, ps in topics.items()))
    return [p.error_code.value for t in r.topics for p in t.partitions]


async def fetch_offsets(c: Consumer, partition: int, epoch: int | None = None, member_id: str | None = None):
    g_cls = entities.nested(FETCH, 9, "request", "OffsetFetchRequestGroup")
    t_cls = entities.nested(FETCH, 9, "request", "OffsetFetchRequestTopics")
    r = await c.call(FETCH, 9, groups=(g_cls(group_id=c.group,
                                             member_id=c.member_id if member_id is None else member_id,
                                             member_epoch=c.epoch if epoch is None else epoch,
                                             topics=(t_cls(name="t", partition_indexes=(partition,)),)),),
                     require_stable=True)
    g = r.groups[0]
    return g.error_code.value, (int(g.topics[0].partitions[0].committed_offset) if g.topics else None)


async def test_commits_carry_the_member_epoch(cluster):
    _state, _clock, consumer, _restart = cluster
    a, b = await consumer("g"), await consumer("g")
    assert await a.heartbeat(0) == E.NONE
    p = min(a.partitions())
    assert await commit(a, {("t", p): 5}) == [E.NONE]
    assert await fetch_offsets(a, p) == (E.NONE, 5)
    assert await commit(a, {("t", p): 6}, epoch=a.epoch + 1) == [E.STALE_MEMBER_EPOCH]
    assert await commit(a, {("t", p): 6}, version=8) == [E.UNSUPPORTED_VERSION]
    assert await commit(a, {("t", p): 6}, member_id="someone") == [E.UNKNOWN_MEMBER_ID]
    assert await commit(a, {("t", p): 6}, epoch=-1, member_id="") == [E.UNKNOWN_MEMBER_ID]
    assert await fetch_offsets(a, p, epoch=a.epoch + 1) == (E.STALE_MEMBER_EPOCH, None)
    assert await fetch_offsets(a, p, member_id="someone") == (E.UNKNOWN_MEMBER_ID, None)
    # b joins; a moves to epoch 2 keeping partitions it had at epoch 1: a commit sent at epoch 1
    # for one of those (it raced the heartbeat) is a's, one for a partition it gave up is not
    assert await b.heartbeat(0) == E.NONE
    assert await a.heartbeat() == E.NONE and await a.heartbeat() == E.NONE
    assert a.epoch == 2
    kept, gone = min(a.partitions()), min(set(range(6)) - a.partitions())
    assert await commit(a, {("t", kept): 7}, epoch=1) == [E.NONE]
    assert await commit(a, {("t", gone): 7}, epoch=1) == [E.STALE_MEMBER_EPOCH]
    assert await fetch_offsets(a, kept) == (E.NONE, 7)
    assert await commit(Consumer(a.conn, "g9"), {("t", 0): 1}, epoch=3) == [E.GROUP_ID_NOT_FOUND]


async def test_a_transactional_commit_with_a_stale_member_epoch_is_an_illegal_generation(cluster):
    state, _clock, consumer, _restart = cluster
    a = await consumer("g")
    assert await a.heartbeat(0) == E.NONE
    groups = state["broker"].groups
    offsets = {("t", 0): groups_committed(9)}
    assert groups.txn_commit("g", 1000, 0, a.epoch + 1, a.member_id, None, offsets) == E.ILLEGAL_GENERATION
    assert groups.txn_commit("g", 1000, 0, a.epoch, "someone", None, offsets) == E.UNKNOWN_MEMBER_ID
    assert groups.txn_commit("g", 1000, 0, a.epoch, a.member_id, None, offsets) == E.NONE


def groups_committed(offset: int):
    from oncelog.storage.group_offsets import Committed
    return Committed(offset, "")


# ------------------------------------------------------------------ group types, listing, conversion

async def test_groups_are_listed_with_their_types_and_described_by_their_own_api(cluster):
    _state, _clock, consumer, _restart = cluster
    a = await consumer("cg")
    assert await a.heartbeat(0) == E.NONE
    classic = Member(a.conn, "classic", topics=("u",))
    assert await classic.join() == E.NONE
    r = await a.call(LIST, 5, states_filter=(), types_filter=())
    listed = {g.group_id: (g.group_type, g.group_state, g.protocol_type) for g in r.groups}
    assert listed["cg"] == ("consumer", "Stable", "consumer")
    assert listed["classic"][0] == "classic"
    r = await a.call(LIST, 5, states_filter=(), types_filter=("CONSUMER",))
    assert [g.group_id for g in r.groups] == ["cg"]
    r = await a.call(DESCRIBE, 5, groups=("cg",), include_authorized_operations=False)
    assert (r.groups[0].error_code.value, r.groups[0].group_state) == (E.NONE, "Dead")   # not a classic group
    d = await describe(a, "classic")
    assert d.error_code.value == E.GROUP_ID_NOT_FOUND


async def test_an_empty_classic_group_becomes_a_consumer_group_and_back_keeping_its_offsets(cluster):
    _state, _clock, consumer, _restart = cluster
    a = await consumer("g")
    assert await commit(a, {("t", 0): 11}, epoch=-1, member_id="") == [E.NONE]   # an assign() user's
    classic = Member(a.conn, "busy")
    assert await classic.join() == E.NONE
    assert await (await consumer("busy")).heartbeat(0) == E.GROUP_ID_NOT_FOUND     # a classic group in use
    assert await a.heartbeat(0) == E.NONE
    assert await fetch_offsets(a, 0) == (E.NONE, 11)
    old = Member(a.conn, "g")
    assert await old.join_once() == E.INCONSISTENT_GROUP_PROTOCOL                  # a consumer group in use
    assert await a.heartbeat(epoch=-1) == E.NONE
    assert await old.join() == E.NONE                                              # empty: classic again
    assert await old.committed("t", 0) == 11
    r = await a.call(DELETE_GROUPS, 2, groups_names=("g",))
    assert r.results[0].error_code.value == E.NON_EMPTY_GROUP


# ------------------------------------------------------------------ across a restart

async def test_a_restarted_broker_keeps_the_group_epoch_assignments_and_pending_revocations(cluster):
    state, _clock, consumer, restart = cluster
    a, b = await consumer("g"), await consumer("g")
    assert await a.heartbeat(0) == E.NONE and await b.heartbeat(0) == E.NONE
    assert await a.heartbeat() == E.NONE                      # a must give up three: not done yet
    before = await describe(a)
    assert before.group_state == "Reconciling"
    saved = [(m.member_id, m.epoch, dict(m.owned)) for m in (a, b)]
    await restart()
    a, b = [await consumer("g", member_id=mid) for mid, _e, _o in saved]
    for m, (_mid, epoch, owned) in zip((a, b), saved):
        m.epoch, m.owned = epoch, owned
    assert await describe(a) == before
    assert await a.heartbeat() == E.NONE and a.epoch == 2     # the revocation goes on where it was
    assert await b.heartbeat() == E.NONE
    assert sorted(a.partitions() | b.partitions()) == list(range(6)) and not a.partitions() & b.partitions()
