"""Issue 36, finding 2: every ConsumerGroupHeartbeat rewrote and fsynced the whole group (1.03 MB
at 1,250 members) and went over every member several times, on the event loop: a join cost 10 ms
at 250 members and 54 ms at 1,250, and another client's ApiVersions waited up to 1.5 s. Kafka
appends only the records of what changed. So does oncelog now (`storage.group_records`); these
tests check the mechanism (bytes written, records recovered, the group's size bound), never a
timing: bench/group_flood.py measures the times.

In-process broker over real sockets (the bytes test counts the broker's writes to its groups'
files), and an `oncelog serve` process killed with SIGKILL for the recovery test."""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest
from test_consumer_group_protocol import Consumer, describe, settle
from test_dedup_raw import Conn
from test_group_protocol import Member, create_topic

from oncelog.broker.config import BrokerConfig
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.in_process import InProcessBroker
from oncelog.testing.raw_client import RawConnection

HB = ApiKey.CONSUMER_GROUP_HEARTBEAT


@pytest.fixture
async def broker(tmp_path, request):
    overrides = getattr(request, "param", {})
    # the broker's clock stands still: on a loaded machine 500 joins outlast a session, and the
    # members fenced meanwhile would write records of their own into what a join is measured at
    now = time.time()
    b = InProcessBroker(BrokerConfig({"log.dirs": str(tmp_path / "data"), "node.id": "1",
                                      "listeners": "PLAINTEXT://127.0.0.1:0", **overrides}), clock=lambda: now)
    host, port = (await b.start())[:2]
    conns: list[Conn] = []

    async def consumer(group: str, **kw) -> Consumer:
        conns.append(await Conn.open(host, port))
        return Consumer(conns[-1], group, **kw)

    admin = await consumer("admin")
    await create_topic(Member(admin.conn, "admin"), "t", 6)
    yield b, consumer
    for c in conns:
        await c.close()
    await b.stop()


class DiskWrites:
    """Bytes the process writes (os.write, os.pwrite and the record logs' hook for it: the durable
    helper and the record logs) to files of the groups' directory."""

    def __init__(self, monkeypatch, directory: Path) -> None:
        from oncelog.storage import failpoints
        self.directory, self.bytes = str(directory), 0
        real_write, real_pwrite, real_hook = os.write, os.pwrite, failpoints.group_write

        def write(fd, data):
            self._count(fd, data)
            return real_write(fd, data)

        def pwrite(fd, data, offset):
            self._count(fd, data)
            return real_pwrite(fd, data, offset)

        def hook(fd, data, offset):
            self._count(fd, data)
            return real_hook(fd, data, offset)

        monkeypatch.setattr(os, "write", write)
        monkeypatch.setattr(os, "pwrite", pwrite)
        monkeypatch.setattr(failpoints, "group_write", hook)

    def _count(self, fd: int, data) -> None:
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return
        if path.startswith(self.directory):
            self.bytes += len(data)


async def test_the_bytes_a_join_writes_do_not_grow_with_the_group(broker, monkeypatch):
    b, consumer = broker
    disk = DiskWrites(monkeypatch, Path(b.config.log_dirs[0]) / "__consumer_offsets")
    conn = (await consumer("g")).conn
    written: dict[int, int] = {}
    for n in range(1, 501):
        m = Consumer(conn, "g", member_id=f"member-{n:05d}-{uuid.uuid4()}")
        before = disk.bytes
        assert await m.heartbeat(0) == E.NONE
        written[n] = disk.bytes - before
    # the 10th and the 500th join write the same records: the group epoch, the target's epoch
    # and the new member (a target only where partitions move: none, six partitions are taken);
    # the whole group was 45 times larger at the 500th join than at the 10th
    small, large = sum(written[n] for n in range(10, 20)), sum(written[n] for n in range(490, 500))
    assert 0 < large <= 1.2 * small, (small, large)


async def test_a_plain_heartbeat_of_an_unchanged_member_writes_nothing(broker, monkeypatch):
    b, consumer = broker
    members = [await consumer("g") for _ in range(3)]
    for m in members:
        assert await m.heartbeat(0) == E.NONE
    await settle(*members)
    disk = DiskWrites(monkeypatch, Path(b.config.log_dirs[0]) / "__consumer_offsets")
    await settle(*members)
    assert disk.bytes == 0


@pytest.mark.parametrize("broker", [{"group.consumer.max.size": "3"}], indirect=True)
async def test_a_full_group_refuses_a_new_member_with_group_max_size_reached(broker):
    b, consumer = broker
    members = [await consumer("g") for _ in range(3)]
    for m in members:
        assert await m.heartbeat(0) == E.NONE
    before = await describe(members[0])
    extra = await consumer("g")
    assert await extra.heartbeat(0) == E.GROUP_MAX_SIZE_REACHED
    assert await describe(members[0]) == before              # nothing stored of it
    await settle(*members)                                    # the members of a full group go on
    assert await members[2].heartbeat(-1) == E.NONE           # one leaves: there is room again
    assert await extra.heartbeat(0) == E.NONE
    assert len((await describe(members[0])).members) == 3


async def test_the_record_log_is_compacted_and_read_back_exactly(broker, monkeypatch):
    """Churn appends far more than the group holds: the log is rewritten with its live records
    (a new file), and a restart's reading of it makes the same group."""
    from oncelog.storage import group_records
    b, consumer = broker
    monkeypatch.setattr(group_records, "COMPACT_SLACK_BYTES", 4096)
    stay = [await consumer("g") for _ in range(4)]
    for m in stay:
        assert await m.heartbeat(0) == E.NONE
    records = b.groups.store.consumer_log("g")
    assert records is not None
    generation = records.generation
    for _ in range(12):
        guest = await consumer("g")
        assert await guest.heartbeat(0) == E.NONE
        await settle(*stay, guest, rounds=3)
        assert await guest.heartbeat(-1) == E.NONE
    assert records.generation > generation                    # compacted at least once
    assert records.size < records.writes
    group = b.groups.consumer.groups["g"]
    reread, record = group_records.RecordLog.read(records.path)
    assert record == group.record()
    assert reread.live == records.live


def test_a_torn_tail_is_cut_and_the_records_before_it_make_the_group(tmp_path):
    from oncelog.core.groups.consumer_group import ConsumerGroup, Member
    from oncelog.storage import group_records
    g = ConsumerGroup("g", 3, 3, {"a": Member("a", member_epoch=3)}, {}, {}, {})
    path = tmp_path / "g.records"
    log = group_records.RecordLog.create(path, g.record())
    g.mark()
    g.update_member(Member("b", member_epoch=3))
    g.group_epoch = 4
    log.append(group_records.changed_records(g.changes()), shared=False)
    whole = path.read_bytes()
    with open(path, "ab") as f:
        f.write(whole[-30:])                                  # half a frame, as a crash leaves it
    again, record = group_records.RecordLog.read(path)
    assert record == g.record()
    assert again.size == len(whole) and path.stat().st_size > len(whole)   # reading writes nothing
    g.mark()
    g.group_epoch = 5
    again.append(group_records.changed_records(g.changes()), shared=False)   # the owner cuts it first
    assert group_records.RecordLog.read(path)[1] == g.record()
    assert path.stat().st_size == again.size


def _describe(address: str) -> tuple:
    with RawConnection(address) as c:
        r = c.call(ApiKey.CONSUMER_GROUP_DESCRIBE, 1, group_ids=("g",), include_authorized_operations=False)
    g = r.groups[0]
    assert int(g.error_code) == E.NONE
    return (str(g.group_state), int(g.group_epoch), int(g.assignment_epoch), tuple(
        (str(m.member_id), int(m.member_epoch), str(m.instance_id), tuple(m.subscribed_topic_names),
         tuple((str(t.topic_name), tuple(t.partitions)) for t in m.assignment.topic_partitions),
         tuple((str(t.topic_name), tuple(t.partitions)) for t in m.target_assignment.topic_partitions))
        for m in sorted(g.members, key=lambda m: str(m.member_id))))


class SyncMember:
    def __init__(self, c: RawConnection, instance: str | None = None) -> None:
        self.c, self.member_id, self.instance = c, str(uuid.uuid4()), instance
        self.epoch, self.owned = 0, {}

    def heartbeat(self, epoch: int | None = None, apply: bool = True) -> int:
        from oncelog.protocol import entities
        tp = entities.nested(HB, 1, "request", "TopicPartitions")
        epoch = self.epoch if epoch is None else epoch
        extra = {"rebalance_timeout": 300000, "subscribed_topic_names": ("t",)} if epoch == 0 else {
            "rebalance_timeout": -1, "subscribed_topic_names": None}
        r = self.c.call(HB, 1, group_id="g", member_id=self.member_id, member_epoch=epoch, instance_id=self.instance,
                        subscribed_topic_regex=None, server_assignor=None, rack_id=None,
                        topic_partitions=tuple(tp(topic_id=t, partitions=tuple(sorted(ps)))
                                               for t, ps in self.owned.items() if ps), **extra)
        code = int(r.error_code)
        if code == E.NONE and epoch >= 0:
            self.epoch = int(r.member_epoch)
            if r.assignment is not None and apply:
                self.owned = {t.topic_id: set(t.partitions) for t in r.assignment.topic_partitions}
        return code


@pytest.mark.processes
def test_a_killed_broker_reads_its_groups_records_back_exactly(tmp_path):
    """Joins, leaves, revocations under way, a static member gone for a while, enough churn to
    compact the log: after SIGKILL, the restarted broker describes the same group, and members
    heartbeat on at the epochs they had."""
    data = tmp_path / "data"
    broker = BrokerProcess(data, {"group.consumer.heartbeat.interval.ms": "5000"}).start()
    try:
        from oncelog.protocol import entities
        with RawConnection(broker.bootstrap) as admin:
            ct = entities.nested(ApiKey.CREATE_TOPICS, 7, "request", "CreatableTopic")
            r = admin.call(ApiKey.CREATE_TOPICS, 7, topics=(ct(name="t", num_partitions=8, replication_factor=1,
                                                               assignments=(), configs=()),),
                           timeout=10000, validate_only=False)
            assert int(r.topics[0].error_code) == 0
        c = RawConnection(broker.bootstrap)
        members = [SyncMember(c, instance="static-1" if i == 0 else None) for i in range(12)]
        for m in members:
            assert m.heartbeat() == E.NONE
        for _ in range(40):           # churn: a guest joins, everybody reconciles, it leaves
            guest = SyncMember(c)
            assert guest.heartbeat() == E.NONE
            for _round in range(2):
                for m in (*members, guest):
                    assert m.heartbeat() == E.NONE
            assert guest.heartbeat(-1) == E.NONE
        assert members[0].heartbeat(-2) == E.NONE              # the static member away for a while
        late = SyncMember(c)
        assert late.heartbeat() == E.NONE                      # a join: revocations asked of others
        members[1].heartbeat(apply=False)                      # told to revoke, not done yet
        before = _describe(broker.bootstrap)
        assert before[0] in ("Reconciling", "Assigning")
        c.close()
        broker.kill()
        assert "compacted" in broker.log_tail(200_000)
        broker.start()
        assert _describe(broker.bootstrap) == before
        with RawConnection(broker.bootstrap) as c2:
            for m in (*members[1:], late):
                m.c = c2
                assert m.heartbeat() == E.NONE
    finally:
        broker.stop()


async def test_a_failed_fsync_answers_not_coordinator_and_the_group_is_read_again_from_disk(broker, monkeypatch):
    """The records are fsynced off the event loop after the heartbeat changed the group in memory:
    when that fsync fails, what it covered is cut off the file, the heartbeats waiting on it are
    told NOT_COORDINATOR (they find the coordinator again and retry), and the group is read again
    from what is on disk, so memory never holds a change the disk lost."""
    import errno

    from oncelog.storage.group_records import RecordLog
    b, consumer = broker
    a, c = await consumer("g"), await consumer("g")
    assert await a.heartbeat(0) == E.NONE
    await settle(a)
    before = await describe(a)
    real = RecordLog.fsync

    def failing(path):
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(RecordLog, "fsync", staticmethod(failing))
    assert await c.heartbeat(0) == E.NOT_COORDINATOR
    monkeypatch.setattr(RecordLog, "fsync", staticmethod(real))
    assert "g" not in b.groups.consumer.groups                  # unloaded
    assert await describe(a) == before                          # read again: c was never a member
    assert await c.heartbeat(0) == E.NONE                       # its retry joins
    await settle(a, c)
    assert len((await describe(a)).members) == 2


async def test_a_groups_records_are_fsynced_and_compacted_off_the_event_loop(broker, monkeypatch):
    """Every fsync a heartbeat waits for runs on a group-commit thread, the group's first (its log
    created) and its compactions' included: a compaction on the loop wrote the group whole (0.6 MB
    at 1,250 members) and fsynced it twice while other clients waited (issue 36's heartbeat
    burst)."""
    import threading

    from test_offset_records import Disk

    from oncelog.storage import group_records
    b, consumer = broker
    monkeypatch.setattr(group_records, "COMPACT_SLACK_BYTES", 4096)
    disk = Disk(monkeypatch, Path(b.config.log_dirs[0]) / "__consumer_offsets")
    loop_thread = threading.get_ident()
    stay = [await consumer("g") for _ in range(4)]
    for m in stay:
        assert await m.heartbeat(0) == E.NONE
    records = b.groups.store.consumer_log("g")
    assert records is not None
    for _ in range(8):
        guest = await consumer("g")
        assert await guest.heartbeat(0) == E.NONE
        await settle(*stay, guest, rounds=3)
        assert await guest.heartbeat(-1) == E.NONE
    assert records.generation > 0                              # compacted
    assert disk.fsync_threads, "nothing was fsynced: the case no longer exercises it"
    assert loop_thread not in disk.fsync_threads
    assert group_records.RecordLog.read(records.path)[1] == b.groups.consumer.groups["g"].record()
