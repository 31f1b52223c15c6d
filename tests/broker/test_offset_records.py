"""Issue 36: every OffsetCommit rewrote and fsynced the group's whole offsets file, and every
TxnOffsetCommit the producer's whole pending offsets, on the event loop (8.5 MB per commit of
2,000 partitions at the largest metadata allowed; another client's ApiVersions waited 370 ms at
p99). Kafka appends only the records of what changed to `__consumer_offsets`. So does oncelog now:
a commit appends the records of the partitions it names to the group's offset log (a transaction's
to the producer's pending log), the group commit fsyncs them off the event loop, and compaction
runs there too (`storage.group_records`, `broker.groups.record_sync`).

These tests check the mechanism (the bytes a commit writes, the thread its fsync runs on, what a
failure or a crash leaves), never a timing: `bench/group_flood.py --commits` measures the times.
In-process brokers over real sockets, and `oncelog serve` processes killed with SIGKILL (by the
test, or by a storage failpoint at an fsync or a compaction's rename), with and without an
emulated power cut."""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import threading
import time
from pathlib import Path

import pytest
from test_dedup_raw import Conn
from tests.security.rights_support import init_producer_id

from oncelog.broker.config import BrokerConfig
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.storage import failpoints, group_records
from oncelog.storage.group_offsets import Committed, GroupOffsetStore
from oncelog.storage.group_records import RecordLog
from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.in_process import InProcessBroker
from oncelog.testing.power_loss import LEDGER, lose_unsynced, with_ledger
from oncelog.testing.raw_client import RawConnection

TOPIC, PARTITIONS = "t", 400
K = ApiKey


# ------------------------------------------------------------------ requests

def _commit_request(group: str, offsets: dict[int, int], metadata: str) -> dict:
    t = entities.nested(K.OFFSET_COMMIT, 8, "request", "OffsetCommitRequestTopic")
    p = entities.nested(K.OFFSET_COMMIT, 8, "request", "OffsetCommitRequestPartition")
    return dict(group_id=group, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
                topics=(t(name=TOPIC, partitions=tuple(
                    p(partition_index=i, committed_offset=o, committed_leader_epoch=-1, committed_metadata=metadata)
                    for i, o in sorted(offsets.items()))),))


def _txn_commit_request(tid: str, pid: int, epoch: int, group: str, offsets: dict[int, int], metadata: str) -> dict:
    t = entities.nested(K.TXN_OFFSET_COMMIT, 3, "request", "TxnOffsetCommitRequestTopic")
    p = entities.nested(K.TXN_OFFSET_COMMIT, 3, "request", "TxnOffsetCommitRequestPartition")
    return dict(transactional_id=tid, group_id=group, producer_id=pid, producer_epoch=epoch, generation_id=-1,
                member_id="", group_instance_id=None,
                topics=(t(name=TOPIC, partitions=tuple(
                    p(partition_index=i, committed_offset=o, committed_leader_epoch=-1, committed_metadata=metadata)
                    for i, o in sorted(offsets.items()))),))


def _codes(r) -> set[int]:
    return {int(p.error_code) for t in r.topics for p in t.partitions}


def _fetch_request(group: str) -> dict:
    return dict(group_id=group, topics=None, require_stable=False)


def _offsets(r) -> dict[int, int]:
    assert int(r.error_code) == E.NONE, r
    return {int(p.partition_index): int(p.committed_offset) for t in r.topics for p in t.partitions
            if int(p.committed_offset) >= 0}


class Client:
    """Raw requests on one connection to an in-process broker (this test's event loop)."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn

    async def commit(self, group: str, offsets: dict[int, int], metadata: str = "") -> set[int]:
        return _codes(await self.conn.call(K.OFFSET_COMMIT, 8, **_commit_request(group, offsets, metadata)))

    async def committed(self, group: str) -> dict[int, int]:
        return _offsets(await self.conn.call(K.OFFSET_FETCH, 7, **_fetch_request(group)))

    async def init(self, tid: str) -> tuple[int, int]:
        r = await init_producer_id(self.conn, tid)
        assert int(r.error_code) == E.NONE, r
        return int(r.producer_id), int(r.producer_epoch)

    async def txn_commit(self, tid: str, pid: int, epoch: int, group: str, offsets: dict[int, int],
                         metadata: str = "") -> set[int]:
        while True:   # CONCURRENT_TRANSACTIONS until the previous transaction completed
            r = await self.conn.call(K.ADD_OFFSETS_TO_TXN, 3, transactional_id=tid, producer_id=pid,
                                     producer_epoch=epoch, group_id=group)
            if int(r.error_code) != E.CONCURRENT_TRANSACTIONS:
                break
            await asyncio.sleep(0.01)
        assert int(r.error_code) == E.NONE, r
        return _codes(await self.conn.call(K.TXN_OFFSET_COMMIT, 3,
                                           **_txn_commit_request(tid, pid, epoch, group, offsets, metadata)))

    async def end(self, tid: str, pid: int, epoch: int, group: str, expected: dict[int, int]) -> None:
        """EndTxn (commit), then until its marker made `expected` the group's."""
        r = await self.conn.call(K.END_TXN, 3, transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                                 committed=True)
        assert int(r.error_code) == E.NONE, r
        deadline = time.monotonic() + 30
        while not expected.items() <= (await self.committed(group)).items():
            assert time.monotonic() < deadline, "the transaction's offsets never became the group's"
            await asyncio.sleep(0.02)


@pytest.fixture
async def broker(tmp_path):
    b = InProcessBroker(BrokerConfig({"log.dirs": str(tmp_path / "data"), "node.id": "1",
                                      "listeners": "PLAINTEXT://127.0.0.1:0"}))
    host, port = (await b.start())[:2]
    conns: list[Conn] = []

    async def client() -> Client:
        conns.append(await Conn.open(host, port))
        return Client(conns[-1])

    c = await client()
    ct = entities.nested(K.CREATE_TOPICS, 7, "request", "CreatableTopic")
    r = await c.conn.call(K.CREATE_TOPICS, 7, topics=(ct(name=TOPIC, num_partitions=PARTITIONS, replication_factor=1,
                                                          assignments=(), configs=()),),
                          timeout=60000, validate_only=False)
    assert int(r.topics[0].error_code) == E.NONE, r
    yield b, client
    for conn in conns:
        await conn.close()
    await b.stop()


def _groups_dir(b: InProcessBroker) -> Path:
    return Path(b.config.log_dirs[0]) / "__consumer_offsets"


class Disk:
    """What the process does to the files of the groups' directory: bytes written (os.write,
    os.pwrite and the record logs' hook for it) and the threads fsyncs ran on."""

    def __init__(self, monkeypatch, directory: Path) -> None:
        self.directory = str(directory) + os.sep
        self.bytes = 0
        self.fsync_threads: list[int] = []
        real_write, real_pwrite, real_fsync = os.write, os.pwrite, os.fsync

        def write(fd, data, *position):
            if self._ours(fd):
                self.bytes += len(data)
            return (real_pwrite if position else real_write)(fd, data, *position)

        def fsync(fd):
            if self._ours(fd):
                self.fsync_threads.append(threading.get_ident())
            return real_fsync(fd)

        monkeypatch.setattr(os, "write", write)
        monkeypatch.setattr(os, "pwrite", write)
        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(failpoints, "group_write", write)
        monkeypatch.setattr(failpoints, "group_sync", fsync)

    def _ours(self, fd: int) -> bool:
        try:
            return (os.readlink(f"/proc/self/fd/{fd}") + os.sep).startswith(self.directory)
        except OSError:
            return False


def _files_bytes(directory: Path, suffix: str) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*" + suffix))


# ------------------------------------------------------------------ the bound

async def test_a_commit_writes_the_partitions_it_names_not_the_groups_offsets(broker, monkeypatch):
    """A one-partition OffsetCommit writes as much to a group holding 400 offsets (with metadata)
    as to a group holding one; before, it rewrote the group's whole file."""
    b, client = broker
    c = await client()
    assert await c.commit("small", {0: 1}) == {E.NONE}
    assert await c.commit("big", {p: 1 for p in range(PARTITIONS)}, "m" * 100) == {E.NONE}
    disk = Disk(monkeypatch, _groups_dir(b))
    written = {}
    for group in ("small", "big", "small", "big"):
        before = disk.bytes
        assert await c.commit(group, {7: 2}) == {E.NONE}
        written[group] = disk.bytes - before
    assert 0 < written["big"] <= written["small"], written
    assert written["big"] * 100 < _files_bytes(_groups_dir(b), ".offsets"), written
    assert (await c.committed("big"))[7] == 2 and len(await c.committed("big")) == PARTITIONS


async def test_a_transactional_commit_and_its_marker_write_what_the_transaction_names(broker, monkeypatch):
    """TxnOffsetCommit appends to the producer's pending log what it names (a one-partition
    commit after a 400-partition one of the same transaction writes as little as one alone); the
    transaction's marker appends its offsets to the group's offset log, as little for a group
    holding 400 offsets as for one holding one."""
    b, client = broker
    c = await client()
    assert await c.commit("small", {0: 1}) == {E.NONE}
    assert await c.commit("big", {p: 1 for p in range(PARTITIONS)}, "m" * 100) == {E.NONE}
    pid, epoch = await c.init("tx")
    disk = Disk(monkeypatch, _groups_dir(b))
    written = {}
    for group in ("small", "big"):
        before = disk.bytes
        assert await c.txn_commit("tx", pid, epoch, group, {9: 3}) == {E.NONE}
        written[f"{group} alone"] = disk.bytes - before
        await c.end("tx", pid, epoch, group, {9: 3})
    assert await c.txn_commit("tx", pid, epoch, "big", {p: 4 for p in range(PARTITIONS)}, "m" * 100) == {E.NONE}
    before = disk.bytes
    assert await c.txn_commit("tx", pid, epoch, "big", {9: 5}) == {E.NONE}
    written["after 400"] = disk.bytes - before
    await c.end("tx", pid, epoch, "big", {9: 5, 10: 4})
    # a marker's bytes: the settled offsets appended to the group, and the producer's log rewritten
    for group in ("small", "big"):
        assert await c.txn_commit("tx", pid, epoch, group, {11: 6}) == {E.NONE}
        before = disk.bytes
        await c.end("tx", pid, epoch, group, {11: 6})
        written[f"{group} marker"] = disk.bytes - before
    assert 0 < written["big alone"] <= written["small alone"], written
    assert written["after 400"] <= written["small alone"], written
    assert 0 < written["big marker"] <= written["small marker"], written
    assert written["big marker"] * 100 < _files_bytes(_groups_dir(b), ".offsets"), written


async def test_commits_are_fsynced_off_the_event_loop(broker, monkeypatch):
    """Every fsync an OffsetCommit or a TxnOffsetCommit waits for runs on a group-commit thread,
    the group's first commit included; before, each ran on the event loop."""
    b, client = broker
    c = await client()
    pid, epoch = await c.init("tx")
    disk = Disk(monkeypatch, _groups_dir(b))
    loop_thread = threading.get_ident()
    assert await c.commit("g", {0: 1}) == {E.NONE}       # the group's first: its log is created
    assert await c.commit("g", {p: 2 for p in range(50)}) == {E.NONE}
    assert await c.txn_commit("tx", pid, epoch, "g", {1: 3}) == {E.NONE}
    assert await c.txn_commit("tx", pid, epoch, "g", {2: 3}) == {E.NONE}
    assert disk.fsync_threads, "nothing was fsynced: the case no longer exercises it"
    assert loop_thread not in disk.fsync_threads


async def test_a_failed_fsync_answers_not_coordinator_and_the_offsets_are_read_again(broker, monkeypatch):
    """The commit's fsync fails: its records are cut off the file, it is answered NOT_COORDINATOR
    (the client finds the coordinator again and retries), and what an OffsetFetch then answers is
    what the file holds, never the lost commit; the next commit is taken."""
    _b, client = broker
    c = await client()
    assert await c.commit("g", {0: 5, 1: 5}) == {E.NONE}
    real = RecordLog.fsync

    def failing(path):
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(RecordLog, "fsync", staticmethod(failing))
    assert await c.commit("g", {0: 6}) == {E.NOT_COORDINATOR}
    pid, epoch = await c.init("tx")
    assert await c.txn_commit("tx", pid, epoch, "g", {1: 7}) == {E.NOT_COORDINATOR}
    monkeypatch.setattr(RecordLog, "fsync", staticmethod(real))
    assert await c.committed("g") == {0: 5, 1: 5}
    assert await c.commit("g", {0: 8}) == {E.NONE}
    assert await c.committed("g") == {0: 8, 1: 5}
    assert await c.txn_commit("tx", pid, epoch, "g", {1: 9}) == {E.NONE}   # the pending log read again too
    await c.end("tx", pid, epoch, "g", {0: 8, 1: 9})


async def test_the_offset_log_is_compacted_off_the_loop_and_read_back_exactly(broker, monkeypatch):
    b, client = broker
    monkeypatch.setattr(group_records, "COMPACT_SLACK_BYTES", 4096)
    c = await client()
    disk = Disk(monkeypatch, _groups_dir(b))
    loop_thread = threading.get_ident()
    for i in range(30):
        assert await c.commit("g", {p: i for p in range(i % 7, 60, 3)}, "m" * 50) == {E.NONE}
    log_ = b.groups.store.offsets_log("g")
    assert log_ is not None and log_.generation > 0 and log_.size < log_.writes   # compacted
    assert loop_thread not in disk.fsync_threads
    expected = await c.committed("g")
    assert GroupOffsetStore(_groups_dir(b)).get("g") == b.groups.store.get("g")
    assert {tp[1]: o.offset for tp, o in GroupOffsetStore(_groups_dir(b)).get("g").items()} == expected


# ------------------------------------------------------------------ what a crash leaves

@pytest.mark.parametrize("tail", ["half a frame", "a corrupt frame"])
def test_a_torn_tail_is_ignored_with_a_log_line_and_cut_by_the_next_commit(tmp_path, caplog, tail):
    store = GroupOffsetStore(tmp_path)
    for i in range(5):
        store.commit("g", {("t", i): Committed(i, "x")})
    store.add_pending(7, 0, "g", {("t", 9): Committed(9, None)}, 1)
    store.add_pending(7, 0, "g", {("t", 8): Committed(8, None)}, 2)
    paths = [tmp_path / "g.offsets", next((tmp_path / "txn-offsets").glob("*/7.records"))]
    for path in paths:
        whole = path.read_bytes()
        with open(path, "ab") as f:
            if tail == "half a frame":
                f.write(whole[-20:])
            else:   # a whole frame whose CRC does not match, then a good one after it
                last = whole[-60:]
                f.write(last[:8] + bytes([last[8] ^ 0xFF]) + last[9:] + whole[:len(whole) // 5])
    caplog.set_level(logging.WARNING, logger="oncelog.storage.group_records")
    again = GroupOffsetStore(tmp_path)
    assert again.get("g") == {("t", i): Committed(i, "x") for i in range(5)}
    assert again.pending() == {7: {"g": {("t", 9): Committed(9, None), ("t", 8): Committed(8, None)}}}
    assert sum("torn or corrupt tail" in r.getMessage() for r in caplog.records) == 2
    again.commit("g", {("t", 5): Committed(5, None)})           # the owner cuts the tail, then appends
    assert again.add_pending(7, 0, "g", {("t", 10): Committed(10, None)}, 3) == E.NONE
    caplog.clear()
    third = GroupOffsetStore(tmp_path)
    assert third.get("g") == {**{("t", i): Committed(i, "x") for i in range(5)}, ("t", 5): Committed(5, None)}
    assert third.pending()[7]["g"][("t", 10)] == Committed(10, None)
    assert not [r for r in caplog.records if "torn" in r.getMessage()]


class Committer(threading.Thread):
    """Commits its own partitions of `group` again and again on its own connection (each time
    every one of them one higher, with 2 KB of metadata: the log compacts every few commits),
    plainly or in transactions; keeps what was acknowledged and what was sent."""

    def __init__(self, bootstrap: str, group: str, partitions: list[int], txn: str | None = None) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.group, self.partitions, self.txn = bootstrap, group, partitions, txn
        self.acked = self.sent = 0
        self.stop = threading.Event()
        self.error: AssertionError | None = None   # an answer other than success

    def run(self) -> None:
        try:
            with RawConnection(self.bootstrap, timeout_s=30) as c:
                pid = epoch = -1
                if self.txn:
                    deadline = time.monotonic() + 30
                    while True:   # the first one creates __transaction_state
                        r = c.call(K.INIT_PRODUCER_ID, 3, transactional_id=self.txn, transaction_timeout=60000,
                                   producer_id=-1, producer_epoch=-1)
                        if int(r.error_code) == E.NONE or time.monotonic() > deadline:
                            break
                        time.sleep(0.05)
                    assert int(r.error_code) == E.NONE, r
                    pid, epoch = int(r.producer_id), int(r.producer_epoch)
                while not self.stop.is_set():
                    n = self.sent + 1
                    offsets = dict.fromkeys(self.partitions, n)
                    self.sent = n
                    if self.txn:
                        while int((r := c.call(K.ADD_OFFSETS_TO_TXN, 3, transactional_id=self.txn, producer_id=pid,
                                               producer_epoch=epoch, group_id=self.group)).error_code) \
                                == E.CONCURRENT_TRANSACTIONS:
                            time.sleep(0.005)   # the previous transaction's markers
                        assert int(r.error_code) == E.NONE, r
                        codes = _codes(c.call(K.TXN_OFFSET_COMMIT, 3, **_txn_commit_request(
                            self.txn, pid, epoch, self.group, offsets, "m" * 2000)))
                        assert codes == {E.NONE}, codes
                        r = c.call(K.END_TXN, 3, transactional_id=self.txn, producer_id=pid, producer_epoch=epoch,
                                   committed=True)
                        assert int(r.error_code) == E.NONE, r
                    else:
                        codes = _codes(c.call(K.OFFSET_COMMIT, 8, **_commit_request(self.group, offsets,
                                                                                    "m" * 2000)))
                        assert codes == {E.NONE}, codes
                    self.acked = n
        except (OSError, EOFError, ConnectionError):
            return   # the broker died: what was acknowledged is what counts
        except AssertionError as e:
            self.error = e


@pytest.mark.processes
@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault", ["kill", "kill+power-loss", "crash-at-fsync", "crash-at-fsync+power-loss",
                                   "crash-at-compaction-rename+power-loss"])
def test_acknowledged_commits_survive_a_crash(tmp_path, fault):
    """Four committers commit their partitions as fast as they are answered: three plainly, to one
    group (whose log only the group commit fsyncs), and one in transactions, to another. The
    broker is killed (by the test, or by a failpoint right before a group log's fsync or a
    compaction's rename), perhaps followed by a power cut (every file cut to what an fsync
    covered). After a restart each partition's offset is at least the last one acknowledged (a
    transaction's once its marker, resent by the recovered coordinator, landed) and at most the
    last one sent."""
    data = tmp_path / "data"
    spec = {"kill": None, "kill+power-loss": None, "crash-at-fsync": "crash:groups:at=fsync:after=60",
            "crash-at-fsync+power-loss": "crash:groups:at=fsync:after=60",
            "crash-at-compaction-rename+power-loss": "crash:groups:at=rename"}[fault]
    power = fault.endswith("power-loss")
    env = {"ONCELOG_FAILPOINTS": with_ledger(spec) if power else spec} if (spec or power) else {}
    broker = BrokerProcess(data, env=env).start()
    try:
        with RawConnection(broker.bootstrap, timeout_s=60) as admin:
            ct = entities.nested(K.CREATE_TOPICS, 7, "request", "CreatableTopic")
            r = admin.call(K.CREATE_TOPICS, 7, topics=(ct(name=TOPIC, num_partitions=40, replication_factor=1,
                                                          assignments=(), configs=()),),
                           timeout=30000, validate_only=False)
            assert int(r.topics[0].error_code) == E.NONE
        committers = [Committer(broker.bootstrap, "g-txn", list(range(3, 40, 4)), "copier")]
        committers[0].start()   # first: its transactions are on their way before the others go
        deadline = time.monotonic() + 120
        while committers[0].acked < 2:
            assert time.monotonic() < deadline and committers[0].is_alive(), committers[0].error
            time.sleep(0.01)
        committers += [Committer(broker.bootstrap, "g", list(range(i, 40, 4))) for i in range(3)]
        for t in committers[1:]:
            t.start()
        if spec is None:
            while sum(t.acked for t in committers) < 80 or min(t.acked for t in committers) < 3:
                assert time.monotonic() < deadline and all(t.is_alive() for t in committers), \
                    [(t.acked, t.error) for t in committers]
                time.sleep(0.01)
            broker.kill()
        else:
            assert broker.proc is not None and broker.proc.wait(120) == -9   # the failpoint fired
        for t in committers:
            t.stop.set()
            t.join(30)
        assert [t.error for t in committers] == [None] * 4
        if spec is not None:
            assert "failpoint crash" in broker.log_tail(200_000)
        if power:
            lose_unsynced(data)
        if fault.startswith("crash-at-compaction"):
            assert list((data / "__consumer_offsets").glob("*.compacting.tmp")), "no compaction was under way"
        broker.env = {"ONCELOG_FAILPOINTS": LEDGER} if power else {}
        broker.start()
        assert min(t.acked for t in committers) > 0, [t.acked for t in committers]
        with RawConnection(broker.bootstrap, timeout_s=60) as c:
            deadline = time.monotonic() + 60
            while True:
                got = {group: _offsets(c.call(K.OFFSET_FETCH, 7, **_fetch_request(group))) for group in ("g", "g-txn")}
                short = {(t.group, p): (got[t.group].get(p), t.acked) for t in committers for p in t.partitions
                         if got[t.group].get(p, 0) < t.acked}
                if not short or time.monotonic() > deadline:
                    break
                time.sleep(0.1)   # a transaction's marker, resent by the recovered coordinator
        assert short == {}, f"acknowledged commits lost: partition -> (after the restart, acknowledged): {short}"
        over = {(t.group, p): (got[t.group][p], t.sent) for t in committers for p in t.partitions
                if got[t.group].get(p, 0) > t.sent}
        assert over == {}
        assert not list((data / "__consumer_offsets").glob("*.compacting.tmp"))   # a leftover goes at open
    finally:
        broker.stop()
