"""The classic group protocol seen from outside, as Kafka's GroupCoordinator answers it: hand-built
JoinGroup / SyncGroup / Heartbeat / LeaveGroup / OffsetCommit / OffsetFetch requests over real
sockets to an in-process Broker with real files. The broker's clock is a test clock where session
timeouts and offset retention matter; rebalance timeouts are real (short) timers."""
from __future__ import annotations

import asyncio
import struct
import time

import pytest
from test_dedup_raw import Conn

from oncelog.broker.config import BrokerConfig
from oncelog.protocol import entities
from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing.in_process import InProcessBroker

JOIN, SYNC, HEARTBEAT, LEAVE, COMMIT, FETCH_OFFSETS, CREATE, DELETE, DESCRIBE = 11, 14, 12, 13, 8, 9, 19, 20, 15
DELETE_GROUPS = 42


def subscription(*topics: str) -> bytes:
    """ConsumerProtocolSubscription v0: what a consumer sends as its protocol metadata."""
    out = [struct.pack(">hi", 0, len(topics))]
    for t in topics:
        out.append(struct.pack(">h", len(t)) + t.encode())
    out.append(struct.pack(">i", -1))
    return b"".join(out)


class Clock:
    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t

    def advance_ms(self, ms: int) -> None:
        self.t += ms / 1000


class Member:
    """One group member on its own connection (a JoinGroup blocks its connection, as in Kafka)."""

    def __init__(self, conn: Conn, group: str, instance: str | None = None, topics=("t",),
                 session_ms: int = 10000, rebalance_ms: int = 10000, protocols=("range",)) -> None:
        self.conn, self.group, self.instance = conn, group, instance
        self.metadata = subscription(*topics)
        self.protocols, self.protocol = protocols, None
        self.session_ms, self.rebalance_ms = session_ms, rebalance_ms
        self.member_id, self.generation, self.leader, self.members = "", -1, "", ()

    async def call(self, api: int, version: int, **fields):
        req = entities.make(entities.entity_class(api, version, "request"), **fields)
        return await self.conn.kio(req, entities.entity_class(api, version, "response"))

    async def join_once(self, version: int = 5):
        proto = entities.nested(JOIN, version, "request", "JoinGroupRequestProtocol")
        r = await self.call(JOIN, version, group_id=self.group, session_timeout=self.session_ms,
                            rebalance_timeout=self.rebalance_ms, member_id=self.member_id,
                            group_instance_id=self.instance, protocol_type="consumer",
                            protocols=tuple(proto(name=n, metadata=self.metadata) for n in self.protocols))
        code = r.error_code.value
        if code in (E.NONE, E.MEMBER_ID_REQUIRED):
            self.member_id = r.member_id
        if code == E.NONE:
            self.generation, self.leader, self.members = int(r.generation_id), r.leader, r.members
            self.protocol = r.protocol_name
        return code

    async def join(self) -> int:
        code = await self.join_once()
        if code == E.MEMBER_ID_REQUIRED:
            code = await self.join_once()
        return code

    async def sync(self, assignments: dict[str, bytes] | None = None, version: int = 5):
        a = entities.nested(SYNC, version, "request", "SyncGroupRequestAssignment")
        r = await self.call(SYNC, version, group_id=self.group, generation_id=self.generation,
                            member_id=self.member_id, group_instance_id=self.instance,
                            protocol_type="consumer", protocol_name=self.protocol,
                            assignments=tuple(a(member_id=m, assignment=v) for m, v in (assignments or {}).items()))
        return r.error_code.value, r.assignment

    async def heartbeat(self, generation: int | None = None, member_id: str | None = None) -> int:
        r = await self.call(HEARTBEAT, 4, group_id=self.group,
                            generation_id=self.generation if generation is None else generation,
                            member_id=self.member_id if member_id is None else member_id,
                            group_instance_id=self.instance)
        return r.error_code.value

    async def commit(self, offsets: dict[tuple[str, int], int], generation: int | None = None,
                     member_id: str | None = None) -> list[int]:
        t_cls = entities.nested(COMMIT, 8, "request", "OffsetCommitRequestTopic")
        p_cls = entities.nested(COMMIT, 8, "request", "OffsetCommitRequestPartition")
        topics = {}
        for (topic, p), off in offsets.items():
            topics.setdefault(topic, []).append(p_cls(partition_index=p, committed_offset=off,
                                                      committed_leader_epoch=-1, committed_metadata=""))
        r = await self.call(COMMIT, 8, group_id=self.group,
                            generation_id_or_member_epoch=self.generation if generation is None else generation,
                            member_id=self.member_id if member_id is None else member_id,
                            group_instance_id=self.instance,
                            topics=tuple(t_cls(name=t, partitions=tuple(ps)) for t, ps in topics.items()))
        return [p.error_code.value for t in r.topics for p in t.partitions]

    async def leave(self, members: list[tuple[str, str | None]]) -> tuple[int, list[int]]:
        ident = entities.nested(LEAVE, 4, "request", "MemberIdentity")
        r = await self.call(LEAVE, 4, group_id=self.group, members=tuple(
            ident(member_id=m, group_instance_id=i) for m, i in members))
        return r.error_code.value, [m.error_code.value for m in r.members]

    async def committed(self, topic: str, partition: int) -> int:
        t_cls = entities.nested(FETCH_OFFSETS, 6, "request", "OffsetFetchRequestTopic")
        r = await self.call(FETCH_OFFSETS, 6, group_id=self.group,
                            topics=(t_cls(name=topic, partition_indexes=(partition,)),))
        return int(r.topics[0].partitions[0].committed_offset)


@pytest.fixture
async def cluster(tmp_path):
    clock = Clock()
    broker = InProcessBroker(BrokerConfig({
        "log.dirs": str(tmp_path / "data"), "listeners": "PLAINTEXT://127.0.0.1:0", "node.id": "1",
        "group.initial.rebalance.delay.ms": "50", "offsets.retention.check.interval.ms": "1",
        "offsets.retention.minutes": "60"}), clock=clock)
    host, port = (await broker.start())[:2]
    conns = []

    async def member(group: str, **kw) -> Member:
        conn = await Conn.open(host, port)
        conns.append(conn)
        return Member(conn, group, **kw)

    admin = await member("admin")
    for topic in ("t", "u"):
        await create_topic(admin, topic, 2)
    yield broker, clock, member
    for c in conns:
        await c.close()
    await broker.stop()


async def create_topic(m: Member, name: str, partitions: int) -> None:
    topic = entities.nested(CREATE, 7, "request", "CreatableTopic")
    r = await m.call(CREATE, 7, topics=(topic(name=name, num_partitions=partitions, replication_factor=1,
                                              assignments=(), configs=()),),
                     timeout=10000, validate_only=False)
    assert r.topics[0].error_code.value == 0, r


async def stable_pair(member, group: str, **kw) -> tuple[Member, Member]:
    """Two members in a Stable generation; a is the leader."""
    a, b = await member(group, **kw.get("a", {})), await member(group, **kw.get("b", {}))
    assert await a.join() == E.NONE
    join_b = asyncio.ensure_future(b.join())
    await asyncio.sleep(0)
    assert await poll(lambda: a.heartbeat(), E.REBALANCE_IN_PROGRESS)
    assert await a.join() == E.NONE
    assert await join_b == E.NONE
    assert a.generation == b.generation and a.leader == a.member_id
    assignments = {a.member_id: b"A", b.member_id: b"B"}
    sync_b = asyncio.ensure_future(b.sync())
    assert await a.sync(assignments) == (E.NONE, b"A")
    assert await sync_b == (E.NONE, b"B")
    return a, b


async def poll(probe, expected, deadline_s: float = 10.0) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if await probe() == expected:
            return True
        await asyncio.sleep(0.02)
    return False


async def group_state(m: Member, group: str) -> str:
    r = await m.call(DESCRIBE, 5, groups=(group,), include_authorized_operations=False)
    return r.groups[0].group_state


# ------------------------------------------------------------------ commits and rebalances

async def test_commit_of_the_current_generation_is_accepted_while_preparing_a_rebalance(cluster):
    """kafkajs commits what it consumed when its heartbeat says REBALANCE_IN_PROGRESS; Kafka takes
    that commit, and refuses commits only in CompletingRebalance."""
    broker, _clock, member = cluster
    a = await member("g1")
    assert await a.join() == E.NONE and await a.sync({a.member_id: b"A"}) == (E.NONE, b"A")
    b = await member("g1")
    join_b = asyncio.ensure_future(b.join())
    assert await poll(lambda: a.heartbeat(), E.REBALANCE_IN_PROGRESS)
    assert await group_state(a, "g1") == "PreparingRebalance"
    assert await a.commit({("t", 0): 42, ("t", 1): 7}) == [E.NONE, E.NONE]
    assert await a.committed("t", 0) == 42
    old_generation = a.generation
    assert await a.join() == E.NONE and await join_b == E.NONE
    assert await group_state(a, "g1") == "CompletingRebalance"
    # the new generation's members have their JoinGroup answer but not yet an assignment
    assert await b.commit({("t", 1): 8}) == [E.REBALANCE_IN_PROGRESS]
    assert await a.commit({("t", 0): 43}, generation=old_generation) == [E.ILLEGAL_GENERATION]
    sync_b = asyncio.ensure_future(b.sync())
    assert (await a.sync({a.member_id: b"A", b.member_id: b"B"}))[0] == E.NONE
    assert (await sync_b)[0] == E.NONE
    assert await b.commit({("t", 1): 8}) == [E.NONE]
    assert await a.committed("t", 1) == 8


async def test_heartbeat_answers_per_state(cluster):
    broker, _clock, member = cluster
    a, b = await stable_pair(member, "g2")
    assert await a.heartbeat() == E.NONE
    assert await a.heartbeat(generation=a.generation + 1) == E.ILLEGAL_GENERATION
    assert await a.heartbeat(member_id="nobody") == E.UNKNOWN_MEMBER_ID
    rejoin = asyncio.ensure_future(a.join())   # the leader rejoining starts a rebalance
    assert await poll(lambda: b.heartbeat(), E.REBALANCE_IN_PROGRESS)
    # the generation is checked before the state, as Kafka does
    assert await b.heartbeat(generation=b.generation - 1) == E.ILLEGAL_GENERATION
    assert await b.join() == E.NONE and await rejoin == E.NONE
    assert await group_state(a, "g2") == "CompletingRebalance"
    assert await b.heartbeat() == E.NONE


async def test_a_follower_rejoining_unchanged_in_stable_gets_the_current_generation(cluster):
    broker, _clock, member = cluster
    a, b = await stable_pair(member, "g3")
    generation = b.generation
    assert await asyncio.wait_for(b.join(), 5) == E.NONE
    assert b.generation == generation and b.members == ()
    assert await group_state(a, "g3") == "Stable"
    assert await a.heartbeat() == E.NONE


async def test_session_timeouts_outside_the_broker_bounds_are_refused(cluster):
    _broker, _clock, member = cluster
    assert await (await member("g4", session_ms=1000)).join() == E.INVALID_SESSION_TIMEOUT
    assert await (await member("g4", session_ms=3_600_000)).join() == E.INVALID_SESSION_TIMEOUT


async def test_a_member_that_stops_heartbeating_is_removed_after_its_session_timeout(cluster):
    broker, clock, member = cluster
    a, b = await stable_pair(member, "g5")
    clock.advance_ms(b.session_ms - 1000)
    assert await a.heartbeat() == E.NONE
    clock.advance_ms(2000)                 # b is now silent for longer than its session timeout
    assert await a.heartbeat() == E.NONE   # a's own session is fresh
    assert await poll(lambda: a.heartbeat(), E.REBALANCE_IN_PROGRESS)
    assert await b.heartbeat() == E.UNKNOWN_MEMBER_ID
    assert await a.join() == E.NONE and a.members and len(a.members) == 1


async def test_a_member_that_never_sends_sync_group_leaves_after_the_rebalance_timeout(cluster):
    broker, _clock, member = cluster
    # a rebalance timeout long enough that b's heartbeat sees the rebalance before it expires,
    # however slow the machine (300 ms was missed under CI's load)
    a, b = await stable_pair(member, "g6", a={"rebalance_ms": 2000}, b={"rebalance_ms": 2000})
    rejoin_a = asyncio.ensure_future(a.join())
    assert await poll(lambda: b.heartbeat(), E.REBALANCE_IN_PROGRESS)
    assert await b.join() == E.NONE and await rejoin_a == E.NONE
    assert (await a.sync({a.member_id: b"A", b.member_id: b"B"}))[0] == E.NONE
    # b never sends SyncGroup: after the rebalance timeout it is removed and the group rebalances
    assert await poll(lambda: a.heartbeat(), E.REBALANCE_IN_PROGRESS)
    assert await b.heartbeat() == E.UNKNOWN_MEMBER_ID


async def test_join_waits_for_pending_member_ids_until_their_session_expires(cluster):
    """A member id handed out with MEMBER_ID_REQUIRED is pending: the rebalance waits for it to
    rejoin (it usually does within milliseconds), and it expires after its session timeout."""
    broker, clock, member = cluster
    a = await member("g7")
    assert await a.join() == E.NONE and (await a.sync({a.member_id: b"A"}))[0] == E.NONE
    silent = await member("g7")
    assert await silent.join_once() == E.MEMBER_ID_REQUIRED      # and never comes back
    rejoin = asyncio.ensure_future(a.join())
    await asyncio.sleep(0.3)
    assert not rejoin.done(), "the rebalance did not wait for the pending member"
    clock.advance_ms(silent.session_ms + 1000)
    assert await asyncio.wait_for(rejoin, 10) == E.NONE
    assert len(a.members) == 1


# ------------------------------------------------------------------ static membership (KIP-345)

async def test_a_restarted_static_member_takes_over_without_a_rebalance(cluster):
    broker, _clock, member = cluster
    a, b = await stable_pair(member, "g8", a={"instance": "inst-a"}, b={"instance": "inst-b"})
    generation, old_a = a.generation, a.member_id
    restarted = await member("g8", instance="inst-a")     # same instance id, no member id
    assert await asyncio.wait_for(restarted.join(), 5) == E.NONE
    assert restarted.member_id != old_a and restarted.generation == generation
    assert restarted.leader != restarted.member_id          # told the old leader: assigns nothing
    assert await restarted.sync() == (E.NONE, b"A")          # its predecessor's assignment
    assert await group_state(a, "g8") == "Stable"
    assert await b.heartbeat() == E.NONE                     # nobody else rebalanced
    # the old incarnation is fenced everywhere
    assert await a.heartbeat() == E.FENCED_INSTANCE_ID
    assert await a.commit({("t", 0): 1}) == [E.FENCED_INSTANCE_ID]
    assert await a.join_once() == E.FENCED_INSTANCE_ID


async def test_a_static_member_rejoining_with_other_protocols_rebalances(cluster):
    """Only a change of the protocol the group would select rebalances (a metadata change with
    the same protocol does not, as in Kafka)."""
    broker, _clock, member = cluster
    a = await member("g9", instance="inst-a", protocols=("range", "roundrobin"))
    assert await a.join() == E.NONE and (await a.sync({a.member_id: b"A"}))[0] == E.NONE
    assert a.protocol == "range"
    restarted = await member("g9", instance="inst-a", protocols=("roundrobin", "range"))
    assert await asyncio.wait_for(restarted.join(), 5) == E.NONE
    assert restarted.generation == a.generation + 1 and restarted.protocol == "roundrobin"
    assert restarted.leader == restarted.member_id


async def test_leave_group_removes_members_by_instance_id(cluster):
    broker, _clock, member = cluster
    a, b = await stable_pair(member, "g10", a={"instance": "inst-a"}, b={"instance": "inst-b"})
    error, per_member = await a.leave([("", "inst-b"), ("", "inst-x"), ("someone-else", "inst-a")])
    assert error == E.NONE
    assert per_member == [E.NONE, E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID]
    assert await b.heartbeat() == E.UNKNOWN_MEMBER_ID
    assert await a.heartbeat() == E.REBALANCE_IN_PROGRESS


# ------------------------------------------------------------------ offsets

async def test_committed_offsets_outlive_an_empty_group_for_the_retention_time(cluster):
    broker, clock, member = cluster
    a, b = await stable_pair(member, "g11")
    assert await a.commit({("t", 0): 5}) == [E.NONE]
    assert await a.leave([(a.member_id, None), (b.member_id, None)]) == (E.NONE, [E.NONE, E.NONE])
    assert await poll(lambda: group_state(a, "g11"), "Empty")
    clock.advance_ms(59 * 60_000)
    broker.groups.expire()
    assert await a.committed("t", 0) == 5                   # 59 of 60 minutes: still there
    clock.advance_ms(2 * 60_000)
    assert await poll(lambda: a.committed("t", 0), -1)      # the broker's tick expires it


async def test_offsets_of_a_group_without_members_expire_by_commit_time(cluster):
    broker, clock, member = cluster
    solo = await member("g12")
    assert await solo.commit({("t", 0): 3}, generation=-1, member_id="") == [E.NONE]
    clock.advance_ms(30 * 60_000)
    assert await solo.commit({("t", 1): 4}, generation=-1, member_id="") == [E.NONE]
    clock.advance_ms(31 * 60_000)
    assert await poll(lambda: solo.committed("t", 0), -1)
    assert await solo.committed("t", 1) == 4


async def test_a_stable_group_keeps_offsets_of_its_topics_and_loses_others(cluster):
    broker, clock, member = cluster
    a, b = await stable_pair(member, "g13")                  # both subscribe to "t" only
    assert await a.commit({("t", 0): 1, ("u", 0): 2}) == [E.NONE, E.NONE]
    clock.advance_ms(61 * 60_000)
    assert await a.heartbeat() == E.NONE and await b.heartbeat() == E.NONE
    assert await poll(lambda: a.committed("u", 0), -1)
    assert await a.committed("t", 0) == 1


async def test_retention_of_an_empty_group_survives_a_restart(tmp_path):
    clock = Clock()
    config = BrokerConfig({"log.dirs": str(tmp_path / "data"), "listeners": "PLAINTEXT://127.0.0.1:0",
                           "group.initial.rebalance.delay.ms": "50",
                           "offsets.retention.check.interval.ms": "1", "offsets.retention.minutes": "60"})
    broker = InProcessBroker(config, clock=clock)
    host, port = (await broker.start())[:2]
    m = Member(await Conn.open(host, port), "g14")
    await create_topic(m, "t", 1)
    assert await m.join() == E.NONE and (await m.sync({m.member_id: b"A"}))[0] == E.NONE
    assert await m.commit({("t", 0): 9}) == [E.NONE]
    assert await m.leave([(m.member_id, None)]) == (E.NONE, [E.NONE])
    await m.conn.close()
    await broker.stop()
    clock.advance_ms(45 * 60_000)
    broker = InProcessBroker(config, clock=clock)              # restarted 45 minutes later
    host, port = (await broker.start())[:2]
    m = Member(await Conn.open(host, port), "g14")
    try:
        assert await m.committed("t", 0) == 9
        clock.advance_ms(16 * 60_000)                        # 61 minutes after the group emptied
        assert await poll(lambda: m.committed("t", 0), -1)
    finally:
        await m.conn.close()
        await broker.stop()


async def test_deleting_a_topic_deletes_its_committed_offsets(cluster):
    broker, _clock, member = cluster
    solo = await member("g15")
    assert await solo.commit({("u", 0): 11}, generation=-1, member_id="") == [E.NONE]
    r = await solo.call(DELETE, 6, topics=(entities.nested(DELETE, 6, "request", "DeleteTopicState")(
        name="u", topic_id=None),), timeout=10000)
    assert r.responses[0].error_code.value == 0
    await create_topic(solo, "u", 2)
    assert await solo.committed("u", 0) == -1


async def test_delete_groups_removes_only_empty_groups_with_their_offsets(cluster):
    broker, _clock, member = cluster
    a, b = await stable_pair(member, "g16")
    assert await a.commit({("t", 0): 4}) == [E.NONE]
    solo = await member("g17")
    assert await solo.commit({("t", 0): 6}, generation=-1, member_id="") == [E.NONE]
    r = await a.call(DELETE_GROUPS, 2, groups_names=("g16", "g17", "never-seen"))
    assert [x.error_code.value for x in r.results] == [E.NON_EMPTY_GROUP, E.NONE, E.GROUP_ID_NOT_FOUND]
    assert await solo.committed("t", 0) == -1
    assert await a.committed("t", 0) == 4


async def test_delete_groups_sees_a_static_member_whose_session_ran_out_before_the_next_tick(cluster):
    """A static member leaves no LeaveGroup behind when it closes; Kafka's exact session timer
    empties the group at its deadline, and librdkafka 0081 deletes the group right after it
    (sleeping session timeout + 1 s). The broker's tick runs once a second, so DeleteGroups and
    OffsetDelete expire the group's ran-out sessions themselves."""
    _broker, clock, member = cluster
    m = await member("g30", instance="static-1")
    assert await m.join() == E.NONE
    assert await m.sync({m.member_id: b"A"}) == (E.NONE, b"A")
    r = await m.call(DELETE_GROUPS, 2, groups_names=("g30",))
    assert r.results[0].error_code.value == E.NON_EMPTY_GROUP
    clock.advance_ms(m.session_ms + 1)       # no tick in between: the test clock moved, not time
    r = await m.call(DELETE_GROUPS, 2, groups_names=("g30",))
    assert r.results[0].error_code.value == E.NONE


# ------------------------------------------------------------------ a restarted coordinator (persisted groups)

LIST_GROUPS = 16


class Restartable:
    """A broker that stops and starts again on the same data (a new port: members reconnect)."""

    def __init__(self, tmp_path) -> None:
        self.clock = Clock()
        self.config = BrokerConfig({
            "log.dirs": str(tmp_path / "data"), "listeners": "PLAINTEXT://127.0.0.1:0", "node.id": "1",
            "group.initial.rebalance.delay.ms": "50", "offsets.retention.check.interval.ms": "1",
            "offsets.retention.minutes": "60"})
        self.broker: InProcessBroker | None = None
        self.conns: list[Conn] = []

    async def start(self) -> None:
        self.broker = InProcessBroker(self.config, clock=self.clock)
        self.host, self.port = (await self.broker.start())[:2]

    async def restart(self, *members: Member) -> None:
        """Stopped and started again; each member's connection goes to the new broker."""
        await self.stop()
        await self.start()
        for m in members:
            m.conn = await self.connect()

    async def connect(self) -> Conn:
        conn = await Conn.open(self.host, self.port)
        self.conns.append(conn)
        return conn

    async def member(self, group: str, **kw) -> Member:
        return Member(await self.connect(), group, **kw)

    async def stop(self) -> None:
        for c in self.conns:
            await c.close()
        self.conns = []
        if self.broker is not None:
            await self.broker.stop()
            self.broker = None


@pytest.fixture
async def restartable(tmp_path):
    r = Restartable(tmp_path)
    await r.start()
    await create_topic(await r.member("admin"), "t", 2)
    yield r
    await r.stop()


async def describe(m: Member, group: str):
    r = await m.call(DESCRIBE, 5, groups=(group,), include_authorized_operations=False)
    return r.groups[0]


async def listed(m: Member) -> dict[str, str]:
    r = await m.call(LIST_GROUPS, 4, states_filter=())
    return {g.group_id: g.group_state for g in r.groups}


async def test_a_restarted_broker_keeps_a_stable_group_at_its_generation(restartable):
    """Kafka's GroupMetadata record: after a restart the group is Stable at the generation its
    leader's SyncGroup handed out, with the same members and assignments; members that keep
    heartbeating and committing see no rebalance."""
    a, b = await stable_pair(restartable.member, "p1")
    generation = a.generation
    assert await a.commit({("t", 0): 5}) == [E.NONE]
    await restartable.restart(a, b)
    assert await a.heartbeat() == E.NONE
    assert await b.heartbeat() == E.NONE
    assert await b.commit({("t", 1): 6}) == [E.NONE]
    assert await a.committed("t", 0) == 5 and await a.committed("t", 1) == 6
    # a member that missed its SyncGroup answer asks again: the same assignment
    assert await b.sync() == (E.NONE, b"B")
    d = await describe(a, "p1")
    assert (d.group_state, d.protocol_type, d.protocol_data) == ("Stable", "consumer", "range")
    assert {m.member_id: m.member_assignment for m in d.members} == {a.member_id: b"A", b.member_id: b"B"}
    assert {m.member_id: m.member_metadata for m in d.members} == {a.member_id: a.metadata, b.member_id: b.metadata}
    assert a.generation == b.generation == generation
    # a follower rejoining with what it had gets the current generation: still no rebalance
    assert await b.join() == E.NONE and b.generation == generation
    assert await a.heartbeat() == E.NONE


async def test_a_member_missing_after_a_restart_leaves_when_its_session_times_out(restartable):
    """Session timers start again at load: a member that does not come back is removed one session
    timeout after the restart (not at once, not never), and the group rebalances without it."""
    a, b = await stable_pair(restartable.member, "p2")
    await restartable.restart(a, b)
    restartable.clock.advance_ms(b.session_ms - 1000)
    assert await a.heartbeat() == E.NONE
    restartable.broker.groups.expire()
    assert await a.heartbeat() == E.NONE                      # b's session from the load still runs
    restartable.clock.advance_ms(2000)
    assert await poll(lambda: a.heartbeat(), E.REBALANCE_IN_PROGRESS)
    generation = a.generation
    assert await a.join() == E.NONE and len(a.members) == 1 and a.generation == generation + 1


async def test_static_members_keep_their_instances_across_a_restart(restartable):
    """A static member restarted after the broker takes over its old member (same generation, its
    assignment, no rebalance); the other keeps heartbeating; the old incarnation is fenced."""
    a, b = await stable_pair(restartable.member, "p3", a={"instance": "inst-a"}, b={"instance": "inst-b"})
    await restartable.restart(a, b)
    assert await b.heartbeat() == E.NONE
    restarted = await restartable.member("p3", instance="inst-a")
    assert await asyncio.wait_for(restarted.join(), 5) == E.NONE
    assert restarted.generation == a.generation and restarted.leader != restarted.member_id
    assert await restarted.sync() == (E.NONE, b"A")
    assert await a.heartbeat() == E.FENCED_INSTANCE_ID
    assert await b.heartbeat() == E.NONE
    # the replacement is stored too: after another restart the new incarnation is the member
    await restartable.restart(restarted, b)
    assert await restarted.heartbeat() == E.NONE and await b.heartbeat() == E.NONE


async def test_describe_groups_and_list_groups_agree_after_a_restart(restartable):
    """An emptied consumer group and a group of offsets only: Empty to both ListGroups and
    DescribeGroups after a restart, and the emptied group's next generation follows its last."""
    a, b = await stable_pair(restartable.member, "p4")
    assert await a.commit({("t", 0): 1}) == [E.NONE]
    assert await a.leave([(a.member_id, None), (b.member_id, None)]) == (E.NONE, [E.NONE, E.NONE])
    assert await poll(lambda: group_state(a, "p4"), "Empty")
    emptied_at = a.generation + 1
    solo = await restartable.member("p5")
    assert await solo.commit({("t", 0): 3}, generation=-1, member_id="") == [E.NONE]
    await restartable.restart(a, solo)
    assert (await listed(a))["p4"] == "Empty" and (await listed(a))["p5"] == "Empty"
    d4, d5 = await describe(a, "p4"), await describe(a, "p5")
    assert (d4.group_state, d4.protocol_type, d4.members) == ("Empty", "consumer", ())
    assert (d5.group_state, d5.members) == ("Empty", ())
    c = await restartable.member("p4")
    assert await c.join() == E.NONE and c.generation == emptied_at + 1


def test_an_offset_with_a_transactional_commit_pending_does_not_expire(tmp_path):
    """Kafka's removeExpiredOffsets keeps an offset whose partition has a transactional commit
    pending: the transaction's COMMIT would otherwise land on a group that lost its offsets."""
    from oncelog.broker.groups.coordinator import GroupCoordinator
    from oncelog.storage.group_offsets import Committed, GroupOffsetStore
    now = [1_000_000]
    groups = GroupCoordinator(GroupOffsetStore(tmp_path), lambda: now[0], offsets_retention_ms=60_000)
    assert groups.commit("simple", -1, "", {("t", 0): Committed(5, None), ("t", 1): Committed(6, None)}) == E.NONE
    assert groups.txn_commit("simple", 77, 0, -1, "", None, {("t", 0): Committed(9, None)}) == E.NONE
    now[0] += 61_000
    assert groups.expire_offsets(now[0]) == 1
    assert groups.committed("simple") == {("t", 0): Committed(5, None, commit_timestamp=1_000_000)}


async def test_a_consumer_member_whose_metadata_is_unreadable_still_joins(cluster):
    """Metadata too short to read its topics (a client's bug, or an attacker's) leaves the group's
    subscriptions unknown, and the rebalance completes all the same. The reader's error used to
    escape the join deadline's timer: the group stayed PreparingRebalance and its members waited
    for their request timeout, again at every attempt."""
    _broker, _clock, member = cluster
    a = await member("g41")
    a.metadata = b"\x00"
    assert await asyncio.wait_for(a.join(), 10) == E.NONE
    assert await a.sync({a.member_id: b"A"}) == (E.NONE, b"A")


async def test_a_storage_error_is_answered_not_coordinator_and_changes_nothing(cluster, monkeypatch):
    """A group's file that cannot be written: the commit is answered NOT_COORDINATOR (Kafka's
    answer to a storage error on __consumer_offsets; clients look for the coordinator and retry),
    the leader's SyncGroup too, and the group rebalances instead of going Stable."""
    from oncelog.storage import failpoints, group_offsets
    broker, _clock, member = cluster
    a = await member("g40")
    assert await a.join() == E.NONE and (await a.sync({a.member_id: b"A"}))[0] == E.NONE
    assert await a.commit({("t", 0): 1}) == [E.NONE]

    def full_disk(*_args):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(group_offsets, "_write_json", full_disk)      # the group's record
    monkeypatch.setattr(failpoints, "group_write", full_disk)         # its offset log
    assert await a.commit({("t", 0): 2}) == [E.NOT_COORDINATOR]
    assert await a.committed("t", 0) == 1
    rejoin = asyncio.ensure_future(a.join())
    assert await asyncio.wait_for(rejoin, 10) == E.NONE
    assert await a.sync({a.member_id: b"A2"}) == (E.NOT_COORDINATOR, b"")
    assert await group_state(a, "g40") == "PreparingRebalance"
    monkeypatch.undo()
    assert await a.join() == E.NONE and await a.sync({a.member_id: b"A3"}) == (E.NONE, b"A3")
