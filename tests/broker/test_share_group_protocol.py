"""Share groups (KIP-932) seen from outside, as Kafka 4.2 answers them: hand-built
ShareGroupHeartbeat / ShareGroupDescribe / ShareFetch / ShareAcknowledge / ListGroups requests
over real sockets to an in-process Broker with real files. The broker's clock is a test clock
where record locks and sessions matter (lock expiry is stepped, never slept for)."""
from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid

import pytest
from test_dedup_raw import Conn, produce_body
from test_group_protocol import Clock

from oncelog.broker.config import BrokerConfig
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.records import encode_batch
from oncelog.storage import failpoints as storage_failpoints
from oncelog.testing.in_process import InProcessBroker

HB, DESCRIBE, FETCH, ACK = (ApiKey.SHARE_GROUP_HEARTBEAT, ApiKey.SHARE_GROUP_DESCRIBE, ApiKey.SHARE_FETCH,
                            ApiKey.SHARE_ACKNOWLEDGE)
LOCK_MS = 30000
ACCEPT, RELEASE, REJECT, RENEW = 1, 2, 3, 4


async def call(conn: Conn, api: int, version: int, **fields):
    req = entities.make(entities.entity_class(api, version, "request"), **fields)
    return await conn.kio(req, entities.entity_class(api, version, "response"))


class Sharer:
    """One share-group member on its own connection: its heartbeat epoch and share session."""

    def __init__(self, conn: Conn, group: str, topic_id: uuid.UUID, topics=("t",)) -> None:
        self.conn, self.group, self.topic_id, self.topics = conn, group, topic_id, tuple(topics)
        self.member_id = str(uuid.uuid4())
        self.epoch = 0
        self.session_epoch = 0
        self.assignment: dict[uuid.UUID, set[int]] = {}

    async def heartbeat(self, epoch: int | None = None) -> int:
        epoch = self.epoch if epoch is None else epoch
        r = await call(self.conn, HB, 1, group_id=self.group, member_id=self.member_id, member_epoch=epoch,
                       rack_id=None, subscribed_topic_names=self.topics if epoch == 0 else None)
        code = r.error_code.value
        if code == E.NONE and epoch >= 0:
            self.epoch = int(r.member_epoch)
            if r.assignment is not None:
                self.assignment = {t.topic_id: set(t.partitions) for t in r.assignment.topic_partitions}
        return code

    async def fetch(self, max_records: int = 500, acks: list[tuple[int, int, list[int]]] = (), version: int = 1,
                    max_wait_ms: int = 0, epoch: int | None = None, mode: int = 0, partitions=(0,),
                    forget=(), acks_by_partition=None):
        """(top-level code, {partition: (error, ack error, [(first, last, delivery count)])}).
        `acks` are partition 0's; `acks_by_partition` {partition: acks} any partition's."""
        v = version
        ab = entities.nested(FETCH, v, "request", "AcknowledgementBatch")
        fp = entities.nested(FETCH, v, "request", "FetchPartition")
        ft = entities.nested(FETCH, v, "request", "FetchTopic")
        fg = entities.nested(FETCH, v, "request", "ForgottenTopic")
        epoch = self.session_epoch if epoch is None else epoch
        by_partition = acks_by_partition if acks_by_partition is not None else {0: acks}
        parts = tuple(fp(partition_index=p, acknowledgement_batches=tuple(
            ab(first_offset=f, last_offset=la, acknowledge_types=tuple(ts)) for f, la, ts in by_partition.get(p, ())))
            for p in partitions)
        r = await call(self.conn, FETCH, v, group_id=self.group, member_id=self.member_id,
                       share_session_epoch=epoch, max_wait=max_wait_ms, min_bytes=1, max_bytes=1 << 20,
                       max_records=max_records, batch_size=max_records, share_acquire_mode=mode,
                       topics=(ft(topic_id=self.topic_id, partitions=parts),),
                       forgotten_topics_data=tuple(fg(topic_id=self.topic_id, partitions=tuple(forget)))
                       if forget else ())
        code = r.error_code.value
        if code == E.NONE:
            self.session_epoch = 1 if epoch == 0 else (0 if epoch == -1 else epoch + 1)
        out = {}
        for t in r.responses:
            for p in t.partitions:
                out[int(p.partition_index)] = (p.error_code.value, int(p.acknowledge_error_code),
                                               [(int(a.first_offset), int(a.last_offset), int(a.delivery_count))
                                                for a in p.acquired_records])
        return code, out

    async def acknowledge(self, acks: list[tuple[int, int, list[int]]], epoch: int | None = None, version: int = 1):
        v = version
        ab = entities.nested(ACK, v, "request", "AcknowledgementBatch")
        ap = entities.nested(ACK, v, "request", "AcknowledgePartition")
        at = entities.nested(ACK, v, "request", "AcknowledgeTopic")
        epoch = self.session_epoch if epoch is None else epoch
        batches = tuple(ab(first_offset=f, last_offset=la, acknowledge_types=tuple(ts)) for f, la, ts in acks)
        r = await call(self.conn, ACK, v, group_id=self.group, member_id=self.member_id, share_session_epoch=epoch,
                       topics=(at(topic_id=self.topic_id, partitions=(
                           ap(partition_index=0, acknowledgement_batches=batches),)),))
        code = r.error_code.value
        if code == E.NONE:
            self.session_epoch = 0 if epoch == -1 else epoch + 1
        parts = {int(p.partition_index): p.error_code.value for t in r.responses for p in t.partitions}
        return code, parts


def offsets(acquired) -> list[int]:
    return [o for f, la, _c in acquired for o in range(f, la + 1)]


@pytest.fixture
async def share(tmp_path):
    clock = Clock()
    config = {"log.dirs": str(tmp_path / "data"), "listeners": "PLAINTEXT://127.0.0.1:0", "node.id": "1",
              "group.share.delivery.count.limit": "3"}
    state: dict = {"clock": clock}
    conns: list[Conn] = []

    async def start() -> None:
        state["broker"] = InProcessBroker(BrokerConfig(config), clock=clock)
        host, port = (await state["broker"].start())[:2]
        state["address"] = (host, port)

    async def conn() -> Conn:
        c = await Conn.open(*state["address"])
        conns.append(c)
        return c

    async def topic(name: str = "t", partitions: int = 1, records: int = 0, batch: int = 5) -> uuid.UUID:
        c = await conn()
        ct = entities.nested(ApiKey.CREATE_TOPICS, 7, "request", "CreatableTopic")
        r = await call(c, ApiKey.CREATE_TOPICS, 7, topics=(ct(name=name, num_partitions=partitions,
                                                                 replication_factor=1, assignments=(), configs=()),),
                       timeout=10000, validate_only=False)
        assert r.topics[0].error_code.value == 0
        await produce(name, records, batch)
        return r.topics[0].topic_id

    async def produce(name: str, records: int, batch: int = 5) -> None:
        c = await conn()
        for start in range(0, records, batch):
            n = min(batch, records - start)
            body = produce_body(9, name, 0, bytes(encode_batch(
                [(0, 1000, None, f"v{start + i}".encode()) for i in range(n)])))
            await c.raw(ApiKey.PRODUCE, 9, body)

    async def group_config(group: str, **configs: str) -> None:
        c = await conn()
        res = entities.nested(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "request", "AlterConfigsResource")
        cfg = entities.nested(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "request", "AlterableConfig")
        r = await call(c, ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, resources=(res(
            resource_type=32, resource_name=group, configs=tuple(
                cfg(name=k.replace("_", "."), config_operation=0, value=v) for k, v in configs.items())),),
            validate_only=False)
        assert r.responses[0].error_code.value == 0, r

    async def sharer(group: str, topic_id: uuid.UUID) -> Sharer:
        s = Sharer(await conn(), group, topic_id)
        assert await s.heartbeat() == E.NONE
        return s

    async def restart() -> None:
        for c in conns:
            await c.close()
        conns.clear()
        await state["broker"].stop()
        await start()

    await start()
    state.update(conn=conn, topic=topic, produce=produce, sharer=sharer, restart=restart, group_config=group_config)
    yield state
    for c in conns:
        await c.close()
    await state["broker"].stop()


async def test_members_share_one_partition_and_each_record_goes_to_one_of_them(share):
    tid = await share["topic"](records=0)
    a, b = await share["sharer"]("g", tid), await share["sharer"]("g", tid)
    assert await a.heartbeat() == E.NONE
    assert a.assignment == {tid: {0}} and b.assignment == {tid: {0}}   # shared, not split
    # a new group starts at the end of the log (share.auto.offset.reset=latest)
    assert (await a.fetch(epoch=0))[0] == E.NONE and (await b.fetch(epoch=0))[0] == E.NONE
    await share["produce"]("t", 20)
    code, got_a = await a.fetch(max_records=7, mode=1, version=2)
    assert code == E.NONE and offsets(got_a[0][2]) == list(range(7))   # strict record limit (KIP-1206)
    code, got_b = await b.fetch(max_records=100)
    assert offsets(got_b[0][2]) == list(range(7, 20))
    # listed and described as a share group
    r = await call(await share["conn"](), ApiKey.LIST_GROUPS, 5, states_filter=(), types_filter=("share",))
    assert [(g.group_id, g.group_type) for g in r.groups] == [("g", "share")]
    d = await call(await share["conn"](), DESCRIBE, 1, group_ids=("g",), include_authorized_operations=False)
    assert d.groups[0].error_code.value == 0 and d.groups[0].group_state == "Stable"
    assert sorted(m.member_id for m in d.groups[0].members) == sorted([a.member_id, b.member_id])


async def test_accept_release_reject_and_lock_expiry(share):
    tid = await share["topic"]()
    await share["group_config"]("g", share_auto_offset_reset="earliest")
    await share["produce"]("t", 10)
    a, b = await share["sharer"]("g", tid), await share["sharer"]("g", tid)
    _c, got = await a.fetch(epoch=0, max_records=10)
    assert offsets(got[0][2]) == list(range(10)) and {c for _f, _l, c in got[0][2]} == {1}
    # b holds nothing: its acknowledgement of a's records is refused and changes nothing
    await b.fetch(epoch=0)
    _c, parts = await b.acknowledge([(0, 0, [ACCEPT])])
    assert parts[0] == E.INVALID_RECORD_STATE
    # a accepts 0-3, releases 4, rejects 5, renews 6-9 (v2)
    code, parts = await a.acknowledge([(0, 3, [ACCEPT]), (4, 4, [RELEASE]), (5, 5, [REJECT])])
    assert code == E.NONE and parts[0] == E.NONE
    _c, got = await b.fetch()
    assert got[0][2] == [(4, 4, 2)]          # released: delivered again, second delivery
    share["clock"].advance_ms(LOCK_MS - 1000)
    assert (await a.acknowledge([(6, 9, [RENEW])], version=2))[1][0] == E.NONE
    share["clock"].advance_ms(2000)          # b's lock on 4 ran out; a's renewed locks did not
    code, got = await a.fetch()
    assert code == E.NONE and got[0][2] == [(4, 4, 3)], (code, got)
    _c, parts = await b.acknowledge([(4, 4, [ACCEPT])])
    assert parts[0] == E.INVALID_RECORD_STATE   # too late: it went back and a holds it now
    # past the delivery count limit (3): released once more, it is archived, never delivered again
    assert (await a.acknowledge([(4, 4, [RELEASE]), (6, 9, [ACCEPT])]))[1][0] == E.NONE
    assert (await b.fetch())[1] == {}


async def test_share_session_epochs(share):
    tid = await share["topic"]()
    a = await share["sharer"]("g", tid)
    assert (await a.fetch(epoch=5))[0] == E.SHARE_SESSION_NOT_FOUND
    assert (await a.acknowledge([], epoch=0))[0] == E.INVALID_SHARE_SESSION_EPOCH
    assert (await a.fetch(epoch=0))[0] == E.NONE
    assert (await a.fetch(epoch=7))[0] == E.INVALID_SHARE_SESSION_EPOCH
    assert (await a.fetch())[0] == E.NONE
    assert (await a.fetch(epoch=-1))[0] == E.NONE    # closed
    assert (await a.fetch(epoch=2))[0] == E.SHARE_SESSION_NOT_FOUND


async def test_acknowledgements_in_an_initial_share_fetch_are_refused_and_change_nothing(share):
    """Kafka refuses acknowledgements in a ShareFetch at epoch 0 (INVALID_REQUEST): a session is
    opened before anything is acknowledged in it. oncelog applied them, and oncelog's client
    sent them that way whenever it had no session with the broker."""
    tid = await share["topic"]()
    await share["group_config"]("g", share_auto_offset_reset="earliest")
    await share["produce"]("t", 4)
    a = await share["sharer"]("g", tid)
    _c, got = await a.fetch(epoch=0, max_records=4)
    assert offsets(got[0][2]) == [0, 1, 2, 3]
    code, parts = await a.fetch(epoch=0, acks=[(0, 1, [ACCEPT])], max_records=0)
    assert (code, parts) == (E.INVALID_REQUEST, {}), (code, parts)
    # the session and the records are as they were: 0-1 are still a's to acknowledge, at epoch 1
    code, parts = await a.acknowledge([(0, 1, [ACCEPT]), (2, 3, [RELEASE])], epoch=1)
    assert (code, parts) == (E.NONE, {0: E.NONE})
    _c, got = await a.fetch(max_records=4)
    assert got[0][2] == [(2, 3, 2)]   # only the released ones come back


async def test_a_closed_session_and_a_member_that_leaves_give_their_records_back(share):
    tid = await share["topic"]()
    await share["group_config"]("g", share_auto_offset_reset="earliest")
    await share["produce"]("t", 6)
    a, b = await share["sharer"]("g", tid), await share["sharer"]("g", tid)
    _c, got = await a.fetch(epoch=0, max_records=3, mode=1, version=2)
    assert offsets(got[0][2]) == [0, 1, 2]
    assert (await a.fetch(epoch=-1, max_records=0, acks=[(0, 0, [ACCEPT])]))[0] == E.NONE
    _c, got = await b.fetch(epoch=0, max_records=10)
    assert got[0][2] == [(1, 2, 2), (3, 5, 1)]
    assert await b.heartbeat(epoch=-1) == E.NONE      # leaves holding 1-5: kept until it closes its session
    c = await share["sharer"]("g", tid)
    _c, got = await c.fetch(epoch=0)
    assert got == {}
    assert (await b.fetch(epoch=-1, max_records=0, acks=[]))[0] == E.NONE   # closed: 1-5 go back
    _c, got = await c.fetch()
    assert got[0][2] == [(1, 2, 3), (3, 5, 2)]


async def test_a_restart_redelivers_only_what_was_not_acknowledged(share):
    tid = await share["topic"]()
    await share["group_config"]("g", share_auto_offset_reset="earliest")
    await share["produce"]("t", 10)
    a = await share["sharer"]("g", tid)
    _c, got = await a.fetch(epoch=0, max_records=10)
    assert offsets(got[0][2]) == list(range(10))
    assert (await a.acknowledge([(0, 4, [ACCEPT]), (7, 7, [ACCEPT])]))[1][0] == E.NONE
    await share["restart"]()
    b = await share["sharer"]("g", tid)
    _c, got = await b.fetch(epoch=0, max_records=10)
    # the acknowledged never come back; the others do, with their delivery counts kept
    assert got[0][2] == [(5, 6, 2), (8, 9, 2)]



async def test_share_metrics_count_what_happened_and_the_lag(share):
    tid = await share["topic"]()
    await share["group_config"]("g", share_auto_offset_reset="earliest")
    await share["produce"]("t", 10)
    a = await share["sharer"]("g", tid)
    _c, got = await a.fetch(epoch=0, max_records=4, mode=1, version=2)
    assert (await a.acknowledge([(0, 1, [ACCEPT]), (2, 2, [RELEASE]), (3, 3, [REJECT])]))[1][0] == E.NONE
    families = {f.name: f for f in share["broker"].metrics.families()}
    events = {s.labels["event"]: s.value for s in families["oncelog_share_records"].samples
              if s.name.endswith("_total")}
    assert {k: events[k] for k in ("acquired", "accepted", "released", "rejected")} == {
        "acquired": 4, "accepted": 2, "released": 1, "rejected": 1}
    lag = {(s.labels["group"], s.labels["topic"]): s.value for s in families["oncelog_share_group_lag"].samples}
    assert lag == {("g", "t"): 8}      # records 2 and up are not done with (2 was released)
    groups = {(s.labels["type"], s.labels["state"]): s.value for s in families["oncelog_groups"].samples}
    assert groups[("share", "Stable")] == 1
    # the fetch created the group's state log (durable when written); the acknowledgements' write
    # was fsynced once
    assert [s.value for s in families["oncelog_share_state_fsyncs"].samples if s.name.endswith("_total")] == [1]


async def test_one_group_id_names_one_group_of_one_type(share):
    tid = await share["topic"]()
    c = await share["conn"]()
    # configs alone do not make a share group (nor stop another type from using the id)
    await share["group_config"]("configured", share_auto_offset_reset="earliest")
    r = await call(c, ApiKey.LIST_GROUPS, 5, states_filter=(), types_filter=())
    assert "configured" not in {g.group_id for g in r.groups}
    a = await share["sharer"]("g", tid)
    assert a.epoch >= 1
    join = await call(c, ApiKey.JOIN_GROUP, 5, group_id="g", session_timeout=10000, rebalance_timeout=10000,
                      member_id="", group_instance_id=None, protocol_type="consumer", protocols=(
                          entities.nested(ApiKey.JOIN_GROUP, 5, "request", "JoinGroupRequestProtocol")(
                              name="range", metadata=b""),))
    assert join.error_code.value == E.INCONSISTENT_GROUP_PROTOCOL
    hb = await call(c, ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, group_id="g", member_id=str(uuid.uuid4()), member_epoch=0,
                    rebalance_timeout=30000, subscribed_topic_names=("t",), topic_partitions=())
    assert hb.error_code.value == E.GROUP_ID_NOT_FOUND
    # and a share group may not take a classic group's id (one with committed offsets here)
    await call(c, ApiKey.OFFSET_COMMIT, 8, group_id="classic", generation_id_or_member_epoch=-1, member_id="",
               group_instance_id=None, topics=(entities.nested(ApiKey.OFFSET_COMMIT, 8, "request",
                                                                "OffsetCommitRequestTopic")(
                   name="t", partitions=(entities.nested(ApiKey.OFFSET_COMMIT, 8, "request",
                                                         "OffsetCommitRequestPartition")(
                       partition_index=0, committed_offset=0, committed_leader_epoch=-1, committed_metadata=""),)),))
    s = Sharer(c, "classic", tid)
    assert await s.heartbeat() == E.GROUP_ID_NOT_FOUND


async def test_group_configs_are_validated_and_describe_answers_only_share_groups(share):
    c = await share["conn"]()
    res = entities.nested(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "request", "AlterConfigsResource")
    cfg = entities.nested(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "request", "AlterableConfig")
    for name, value in (("share.auto.offset.reset", "sometimes"), ("share.isolation.level", "read_dirty"),
                        ("share.record.lock.duration.ms", "-5"), ("no.such.config", "1")):
        r = await call(c, ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, validate_only=False, resources=(res(
            resource_type=32, resource_name="g", configs=(cfg(name=name, config_operation=0, value=value),)),))
        assert r.responses[0].error_code.value == E.INVALID_CONFIG, (name, value)
    d = await call(c, DESCRIBE, 1, group_ids=("nobody",), include_authorized_operations=False)
    assert d.groups[0].error_code.value == E.GROUP_ID_NOT_FOUND


async def test_describe_configs_answers_a_groups_configs_with_their_source_across_a_restart(share):
    """DescribeConfigs of a GROUP resource (kafka-configs.sh --describe --entity-type groups): each
    share-group config, GROUP_CONFIG where it is set on the group, the default elsewhere; a group
    nobody configured gets the defaults. It was refused as an unsupported resource type."""
    async def describe(group: str) -> dict[str, tuple[str, int]]:
        c = await share["conn"]()
        res = entities.nested(ApiKey.DESCRIBE_CONFIGS, 4, "request", "DescribeConfigsResource")
        r = await call(c, ApiKey.DESCRIBE_CONFIGS, 4, resources=(res(resource_type=32, resource_name=group,
                                                                     configuration_keys=None),),
                       include_synonyms=False, include_documentation=True)
        assert r.results[0].error_code.value == E.NONE, r.results[0]
        assert all(x.documentation for x in r.results[0].configs)
        return {x.name: (x.value, int(x.config_source)) for x in r.results[0].configs}

    default, group_config = 5, 8
    fresh = await describe("nobody-configured-this")
    assert fresh["share.auto.offset.reset"] == ("latest", default)
    assert fresh["share.record.lock.duration.ms"][1] == default
    assert fresh["errors.deadletterqueue.topic.name"] == ("", default)
    await share["group_config"]("g", share_auto_offset_reset="earliest", share_record_lock_duration_ms="15000")
    await share["restart"]()
    got = await describe("g")
    assert got["share.auto.offset.reset"] == ("earliest", group_config)
    assert got["share.record.lock.duration.ms"] == ("15000", group_config)
    assert got["share.isolation.level"] == ("read_uncommitted", default)


def count_fsyncs(monkeypatch) -> list[int]:
    """Every fsync the process makes from here on (the share-state hook calls os.fsync through the
    failpoint layer once a rule is set, and this one never fires)."""
    storage_failpoints.configure("fsync-eio:share:after=1000000000")
    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    return calls


@pytest.fixture
def failpoints():
    yield storage_failpoints.configure
    storage_failpoints.configure(None)


async def produce_to(share, name: str, partition: int, records: int, batch: int = 5) -> None:
    c = await share["conn"]()
    for start in range(0, records, batch):
        n = min(batch, records - start)
        body = produce_body(9, name, partition, bytes(encode_batch(
            [(0, 1000, None, f"p{partition}-{start + i}".encode()) for i in range(n)])))
        await c.raw(ApiKey.PRODUCE, 9, body)


async def test_one_fsync_makes_a_fetch_over_eight_partitions_durable(share, monkeypatch, failpoints):
    tid = await share["topic"](partitions=8)
    await share["group_config"]("g", share_auto_offset_reset="earliest")
    for p in range(8):
        await produce_to(share, "t", p, 5)
    a = await share["sharer"]("g", tid)
    _c, got = await a.fetch(epoch=0, max_records=1000, partitions=range(8))   # creates the group's log
    assert sorted(got) == list(range(8))
    fsyncs = count_fsyncs(monkeypatch)
    acks = {p: [(0, 4, [ACCEPT])] for p in range(8)}
    code, parts = await a.fetch(max_records=0, acks_by_partition=acks, partitions=range(8))
    assert code == E.NONE and all(parts[p][1] == E.NONE for p in range(8))
    assert len(fsyncs) == 1     # not one per partition (each was a file replaced and fsynced, with its directory)


async def test_requests_that_arrive_together_share_one_fsync(share, monkeypatch, failpoints):
    tid = await share["topic"](partitions=8)
    await share["group_config"]("g", share_auto_offset_reset="earliest")
    members = [await share["sharer"]("g", tid) for _ in range(4)]
    for m in members:   # (the first creates the group's state log)
        assert (await m.fetch(epoch=0, max_records=1, partitions=range(8)))[0] == E.NONE
    for p in range(8):
        await produce_to(share, "t", p, 40, batch=1)
    # a slow disk: the first request's fsync is held until the other three wait behind it
    storage_failpoints.configure("fsync-eio:share:after=1000000000")
    fsyncs: list[int] = []
    gate = threading.Event()
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), gate.wait(30), real(fd))[2])
    fetches = [asyncio.create_task(m.fetch(max_records=10, mode=1, version=2, partitions=range(8)))
               for m in members]
    share_groups = share["broker"].groups.share
    deadline = time.monotonic() + 30
    while share_groups.commit.waiting(share_groups._syncs["g"]) < 4:
        assert time.monotonic() < deadline and not any(f.done() for f in fetches)
        await asyncio.sleep(0.005)
    gate.set()
    results = await asyncio.gather(*fetches)
    given = [(p, o) for _code, parts in results for p, (_e, _a, acq) in parts.items() for o in offsets(acq)]
    assert all(code == E.NONE for code, _p in results)
    assert len(given) == 40 and len(set(given)) == 40          # each record to one member
    assert len(fsyncs) == 2, fsyncs   # the first request's write, then one for the three behind it


async def test_a_failed_state_write_hands_nothing_out_and_answers_a_storage_error(share, failpoints):
    tid = await share["topic"]()
    await share["group_config"]("g", share_auto_offset_reset="earliest")
    await share["produce"]("t", 10)
    a = await share["sharer"]("g", tid)
    _c, got = await a.fetch(epoch=0, max_records=4, mode=1, version=2)    # creates the group's log
    assert offsets(got[0][2]) == [0, 1, 2, 3]
    failpoints("fsync-eio:share")
    code, got = await a.fetch(max_records=3, mode=1, version=2)
    assert code == E.NONE and got[0][0] == E.KAFKA_STORAGE_ERROR and got[0][2] == []
    # not handed out: the next fetch gets them, as their first delivery
    code, got = await a.fetch(max_records=3, mode=1, version=2)
    assert code == E.NONE and got[0][2] == [(4, 6, 1)]
    failpoints("fsync-eio:share")
    code, parts = await a.acknowledge([(0, 3, [ACCEPT])])
    assert code == E.NONE and parts[0] == E.KAFKA_STORAGE_ERROR
    failpoints(None)
    # the disk is back: the next write holds every share-partition of the group whole
    assert (await a.acknowledge([(4, 6, [ACCEPT])]))[1][0] == E.NONE
    await share["restart"]()
    b = await share["sharer"]("g", tid)
    _c, got = await b.fetch(epoch=0, max_records=10)
    assert offsets(got[0][2]) == [7, 8, 9]
