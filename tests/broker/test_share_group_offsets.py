"""A share group's offsets (DescribeShareGroupOffsets 90, AlterShareGroupOffsets 91,
DeleteShareGroupOffsets 92) as Kafka 4.2 answers them: hand-built requests over real sockets to
an in-process Broker with real files (the `share` fixture of test_share_group_protocol.py),
restarted on the same data where durability is the point; the broker killed -9 is in
tests/compat/test_share_groups.py. Authorization is the generated tests' (tests/security), the
lost lease's NOT_COORDINATOR tests/controller/test_share_group_ownership.py's."""
from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest
import test_share_group_protocol as protocol
from test_share_group_protocol import ACCEPT, REJECT, Sharer, call, offsets

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E

share, failpoints = protocol.share, protocol.failpoints   # that module's fixtures
DESCRIBE, ALTER, DELETE = (ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, ApiKey.ALTER_SHARE_GROUP_OFFSETS,
                           ApiKey.DELETE_SHARE_GROUP_OFFSETS)


async def describe(conn, groups, topics=None, version: int = 1):
    """DescribeShareGroupOffsets of `groups` (a name or names), `topics` {topic: [partitions]}
    for each (None: all); the answer's groups."""
    rg = entities.nested(DESCRIBE, version, "request", "DescribeShareGroupOffsetsRequestGroup")
    rt = entities.nested(DESCRIBE, version, "request", "DescribeShareGroupOffsetsRequestTopic")
    names = (groups,) if isinstance(groups, str) else tuple(groups)
    asked = None if topics is None else tuple(rt(topic_name=t, partitions=tuple(ps)) for t, ps in topics.items())
    r = await call(conn, DESCRIBE, version, groups=tuple(rg(group_id=g, topics=asked) for g in names))
    return r.groups


def starts(group) -> dict[tuple[str, int], tuple]:
    """{(topic, partition): (start offset, lag, error code)} of a described group (lag None in v0)."""
    return {(str(t.topic_name), int(p.partition_index)): (int(p.start_offset), getattr(p, "lag", None),
                                                         p.error_code.value)
            for t in group.topics for p in t.partitions}


async def alter(conn, group: str, offsets: dict[tuple[str, int], int] | list):
    """AlterShareGroupOffsets: (top-level code, {(topic, partition): code}); `offsets` a dict, or a
    list of ((topic, partition), offset) to name a partition twice."""
    pt = entities.nested(ALTER, 0, "request", "AlterShareGroupOffsetsRequestTopic")
    pp = entities.nested(ALTER, 0, "request", "AlterShareGroupOffsetsRequestPartition")
    by_topic: dict[str, list] = {}
    for (t, p), o in (offsets.items() if isinstance(offsets, dict) else offsets):
        by_topic.setdefault(t, []).append(pp(partition_index=p, start_offset=o))
    r = await call(conn, ALTER, 0, group_id=group, topics=tuple(
        pt(topic_name=t, partitions=tuple(ps)) for t, ps in by_topic.items()))
    return r.error_code.value, [((str(t.topic_name), int(p.partition_index)), p.error_code.value)
                                for t in r.responses for p in t.partitions]


async def delete(conn, group: str, topics):
    """DeleteShareGroupOffsets: (top-level code, [(topic, code)])."""
    dt = entities.nested(DELETE, 0, "request", "DeleteShareGroupOffsetsRequestTopic")
    r = await call(conn, DELETE, 0, group_id=group, topics=tuple(dt(topic_name=t) for t in topics))
    return r.error_code.value, [(str(t.topic_name), t.error_code.value) for t in r.responses]


async def consumed(share, group: str, tid, records: int, accept: int, reject=()) -> Sharer:
    """A member of `group` that fetched `records` of t-0 and accepted the first `accept`, rejected
    `reject`."""
    a = await share["sharer"](group, tid)
    _c, got = await a.fetch(epoch=0, max_records=records, mode=1, version=2)
    assert offsets(got[0][2]) == list(range(records))
    acks = [(0, accept - 1, [ACCEPT])] + [(o, o, [REJECT]) for o in reject]
    assert (await a.acknowledge(acks))[1][0] == E.NONE
    return a


async def test_describe_answers_each_share_partitions_start_offset_and_lag(share):
    tid = await share["topic"]()
    await share["group_config"]("g", share_auto_offset_reset="earliest")
    await share["produce"]("t", 10)
    c = await share["conn"]()
    # no state yet (nor a share group): -1, no error, as Kafka answers; all: nothing
    assert starts((await describe(c, "g", {"t": [0]}))[0]) == {("t", 0): (-1, -1, E.NONE)}
    assert (await describe(c, "g"))[0].topics == ()
    await consumed(share, "g", tid, 10, accept=4, reject=[5])   # 4 is the first not done with; 5 is
    # KIP-1226's lag: the high watermark (10) - the start (4) - those done with above it (5): 5
    assert starts((await describe(c, "g", {"t": [0]}))[0]) == {("t", 0): (4, 5, E.NONE)}
    assert starts((await describe(c, "g"))[0]) == {("t", 0): (4, 5, E.NONE)}
    assert starts((await describe(c, "g", {"t": [0]}, version=0))[0]) == {("t", 0): (4, None, E.NONE)}
    # a topic that does not exist, a partition without a state: -1, no error
    g = (await describe(c, "g", {"nope": [0], "t": [0, 7]}))[0]
    assert starts(g) == {("nope", 0): (-1, -1, E.NONE), ("t", 0): (4, 5, E.NONE), ("t", 7): (-1, -1, E.NONE)}
    # (kio reads the zero id an unknown topic is answered with as None)
    assert {str(t.topic_name): t.topic_id for t in g.topics} == {"nope": None, "t": tid}
    # the state survives a restart, and so does the lag
    await share["restart"]()
    c = await share["conn"]()
    assert starts((await describe(c, "g"))[0]) == {("t", 0): (4, 5, E.NONE)}


async def test_alter_needs_an_empty_group_and_is_where_the_next_member_starts(share):
    tid = await share["topic"](records=20)
    await share["group_config"]("g", share_auto_offset_reset="earliest")
    a = await consumed(share, "g", tid, 10, accept=5)   # holds 5-9
    c = await share["conn"]()
    assert await alter(c, "g", {("t", 0): 15}) == (E.NON_EMPTY_GROUP, [])
    assert starts((await describe(c, "g"))[0]) == {("t", 0): (5, 15, E.NONE)}
    assert await a.heartbeat(epoch=-1) == E.NONE   # left; its session still holds 5-9
    assert await alter(c, "g", {("t", 0): 15}) == (E.NONE, [(("t", 0), E.NONE)])
    assert starts((await describe(c, "g"))[0]) == {("t", 0): (15, 5, E.NONE)}
    # what the member that left held went with the old state
    assert (await a.acknowledge([(5, 9, [ACCEPT])]))[1][0] == E.INVALID_RECORD_STATE
    await share["restart"]()   # durable: the next member starts there
    b = await share["sharer"]("g", tid)
    _c, got = await b.fetch(epoch=0, max_records=100)
    assert got[0][2] == [(15, 19, 1)]


async def test_alter_refuses_what_kafka_refuses_and_may_make_a_share_group(share):
    await share["topic"](partitions=2, records=0)
    c = await share["conn"]()
    # the id of a classic group (committed offsets)
    ct = entities.nested(ApiKey.OFFSET_COMMIT, 8, "request", "OffsetCommitRequestTopic")
    cp = entities.nested(ApiKey.OFFSET_COMMIT, 8, "request", "OffsetCommitRequestPartition")
    await call(c, ApiKey.OFFSET_COMMIT, 8, group_id="classic", generation_id_or_member_epoch=-1, member_id="",
               group_instance_id=None, topics=(ct(name="t", partitions=(cp(
                   partition_index=0, committed_offset=0, committed_leader_epoch=-1, committed_metadata=""),)),))
    assert (await alter(c, "classic", {("t", 0): 0}))[0] == E.GROUP_ID_NOT_FOUND
    # per partition: unknown topic or partition, a start below -1, a partition named twice
    code, parts = await alter(c, "fresh", [(("t", 0), 3), (("t", 1), -2), (("t", 9), 0), (("nope", 0), 0),
                                           (("t", 0), 4)])
    assert code == E.NONE
    assert parts == [(("t", 0), E.NONE), (("t", 1), E.INVALID_REQUEST), (("t", 9), E.UNKNOWN_TOPIC_OR_PARTITION),
                     (("t", 0), E.INVALID_REQUEST), (("nope", 0), E.UNKNOWN_TOPIC_OR_PARTITION)]
    # an id no group had is a share group now (Kafka creates it), listed and described
    r = await call(c, ApiKey.LIST_GROUPS, 5, states_filter=(), types_filter=("share",))
    assert [(g.group_id, g.group_state) for g in r.groups] == [("fresh", "Empty")]
    assert starts((await describe(c, "fresh"))[0]) == {("t", 0): (3, 0, E.NONE)}
    # -1 is Kafka's "uninitialized": the state goes, the next fetch starts at share.auto.offset.reset
    assert await alter(c, "fresh", {("t", 0): -1}) == (E.NONE, [(("t", 0), E.NONE)])
    assert (await describe(c, "fresh"))[0].topics == ()


async def test_delete_drops_a_topics_state_and_the_next_fetch_starts_afresh(share):
    tid = await share["topic"](records=10)
    await share["topic"]("u", records=0)
    await share["group_config"]("g", share_auto_offset_reset="earliest")
    a = await consumed(share, "g", tid, 10, accept=10)
    c = await share["conn"]()
    assert await delete(c, "g", ["t"]) == (E.NON_EMPTY_GROUP, [])
    assert await a.heartbeat(epoch=-1) == E.NONE
    assert (await delete(c, "nobody", ["t"]))[0] == E.GROUP_ID_NOT_FOUND
    code, topics = await delete(c, "g", ["t", "u", "nope", "t"])
    assert code == E.NONE
    assert sorted(topics) == sorted([("t", E.NONE), ("u", E.UNKNOWN_TOPIC_OR_PARTITION),     # u: no state
                                     ("nope", E.UNKNOWN_TOPIC_OR_PARTITION), ("t", E.INVALID_REQUEST)])
    assert (await describe(c, "g"))[0].topics == ()
    await share["restart"]()
    c = await share["conn"]()
    assert starts((await describe(c, "g", {"t": [0]}))[0]) == {("t", 0): (-1, -1, E.NONE)}
    # the group is still a share group; its next fetch initializes t-0 again (earliest: from 0)
    b = await share["sharer"]("g", tid)
    _c, got = await b.fetch(epoch=0, max_records=100)
    assert got[0][2] == [(0, 9, 1)]


async def test_a_deletion_whose_write_failed_is_written_by_the_groups_next_write(share, failpoints):
    """The group commit writes only what changed since its last write; after a failed write it
    writes every share-partition whole, and a deletion has no share-partition left in memory to
    write: without its tombstone carried into that rewrite, the disk kept the deleted state, and
    after a restart the share-partition came back at its old start offset."""
    tid = await share["topic"](records=10)
    await share["topic"]("u", records=10)
    await share["group_config"]("g", share_auto_offset_reset="earliest")
    a = await consumed(share, "g", tid, 10, accept=10)
    assert await a.heartbeat(epoch=-1) == E.NONE
    c = await share["conn"]()
    assert await alter(c, "g", {("u", 0): 2}) == (E.NONE, [(("u", 0), E.NONE)])
    failpoints("fsync-eio:share")   # the next fsync of a share-state log fails (once)
    assert await delete(c, "g", ["t"]) == (E.NONE, [("t", E.KAFKA_STORAGE_ERROR)])
    assert await alter(c, "g", {("u", 0): 4}) == (E.NONE, [(("u", 0), E.NONE)])
    await share["restart"]()
    c = await share["conn"]()
    assert starts((await describe(c, "g", {"t": [0], "u": [0]}))[0]) == {
        ("t", 0): (-1, -1, E.NONE), ("u", 0): (4, 6, E.NONE)}


async def test_one_request_does_work_bounded_by_what_exists_not_by_what_it_names(share):
    """A client with DESCRIBE on groups can name a group, a partition or an unknown id as often as
    a request holds: each distinct thing is looked at once (the repeats INVALID_REQUEST, cheap),
    a write carries at most one state per existing partition, and ids that are no share group are
    never looked up in the store (which kept a log object per id)."""
    tid = await share["topic"](partitions=2, records=10)
    await share["group_config"]("g", share_auto_offset_reset="earliest")
    a = await consumed(share, "g", tid, 10, accept=10)
    assert await a.heartbeat(epoch=-1) == E.NONE
    c = await share["conn"]()
    coordinator = share["broker"].groups.share
    groups = await describe(c, ["g"] * 300, {"t": [0] * 2000 + [1]})
    assert [g.error_code.value for g in groups] == [E.NONE] + [E.INVALID_REQUEST] * 299
    codes = [p.error_code.value for t in groups[0].topics for p in t.partitions]
    assert codes.count(E.NONE) == 2 and codes.count(E.INVALID_REQUEST) == 1999
    known = set(coordinator.store._logs)
    groups = await describe(c, [f"nobody-{i}" for i in range(500)], {"t": [0]})
    assert {starts(g)[("t", 0)] for g in groups} == {(-1, -1, E.NONE)}
    assert set(coordinator.store._logs) == known
    writes = coordinator._syncs["g"].writes
    code, parts = await alter(c, "g", [(("t", p), 0) for p in range(5000)] + [(("t", 0), 1)] * 1000)
    assert code == E.NONE
    assert [code for (_t, p), code in parts if p < 2] == [E.NONE, E.NONE] + [E.INVALID_REQUEST] * 1000
    assert {code for (_t, p), code in parts if p >= 2} == {E.UNKNOWN_TOPIC_OR_PARTITION}
    assert coordinator._syncs["g"].writes == writes + 1   # one group commit for both share-partitions


@pytest.mark.parametrize("api", [DESCRIBE, ALTER, DELETE])
async def test_share_groups_off_answers_unsupported_version(share, api):
    c = await share["conn"]()
    fu = entities.nested(ApiKey.UPDATE_FEATURES, 1, "request", "FeatureUpdateKey")
    r = await call(c, ApiKey.UPDATE_FEATURES, 1, timeout=30000, validate_only=False, feature_updates=(
        fu(feature="share.version", max_version_level=0, upgrade_type=2),))
    assert r.error_code.value == E.NONE
    if api == DESCRIBE:
        assert (await describe(c, "g"))[0].error_code.value == E.UNSUPPORTED_VERSION
    elif api == ALTER:
        assert (await alter(c, "g", {("t", 0): 0}))[0] == E.UNSUPPORTED_VERSION
    else:
        assert (await delete(c, "g", ["t"]))[0] == E.UNSUPPORTED_VERSION


async def test_a_fetch_between_a_deletion_and_its_write_starts_afresh(share, monkeypatch, failpoints):
    """The share session a member left open fetches t-0 after DeleteShareGroupOffsets dropped its
    state and before the tombstone's write began (the group's previous write held in its fsync):
    the fetch initializes t-0 afresh at share.auto.offset.reset, above the deleted state's epoch.
    Before, it loaded the deleted state from the store, and the group's next write wrote that back
    over the deletion, which had been answered as done."""
    tid = await share["topic"](records=10)
    await share["topic"]("u", records=10)
    await share["group_config"]("g", share_auto_offset_reset="earliest")
    c1, c2 = await share["conn"](), await share["conn"]()
    for _ in range(2):   # t-0 at state epoch 1 (the first state is at 0, each reset one above)
        assert await alter(c1, "g", {("t", 0): 0}) == (E.NONE, [(("t", 0), E.NONE)])
    a = await consumed(share, "g", tid, 10, accept=10)    # t-0 starts at 10 now
    assert await a.heartbeat(epoch=-1) == E.NONE           # left; its share session stays open
    assert await alter(c1, "g", {("u", 0): 2}) == (E.NONE, [(("u", 0), E.NONE)])
    coordinator = share["broker"].groups.share
    sync = coordinator._syncs["g"]
    failpoints("fsync-eio:share:after=1000000000")   # the share-state fsyncs go through os.fsync, never fail
    gate = threading.Event()
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (gate.wait(30), real(fd))[1])

    async def until(what, done) -> None:
        deadline = time.monotonic() + 30
        while not done():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.005)

    altering = asyncio.create_task(alter(c1, "g", {("u", 0): 3}))
    await until("the alter's write in its fsync", lambda: coordinator.commit.waiting(sync) >= 1)
    deleting = asyncio.create_task(delete(c2, "g", ["t"]))
    await until("t-0 deleted, its write not begun", lambda: (tid, 0) in sync.tombstones)
    fetching = asyncio.create_task(a.fetch(max_records=3, mode=1, version=2))
    await until("t-0 loaded by the fetch", lambda: ("g", tid, 0) in coordinator.partitions)
    gate.set()
    assert await altering == (E.NONE, [(("u", 0), E.NONE)])
    assert await deleting == (E.NONE, [("t", E.NONE)])
    code, got = await fetching
    assert code == E.NONE and got[0][2] == [(0, 2, 1)], got   # afresh: from the log start, first delivery
    await share["restart"]()
    c = await share["conn"]()
    assert starts((await describe(c, "g", {"t": [0], "u": [0]}))[0]) == {
        ("t", 0): (0, 10, E.NONE), ("u", 0): (3, 7, E.NONE)}
