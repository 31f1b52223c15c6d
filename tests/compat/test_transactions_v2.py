"""Transactions V2 (KIP-890 part 2) against a real `oncelog serve`, in raw requests as Kafka 4's
Java producer sends them: Produce v12 adds its partitions itself (no AddPartitionsToTxn), EndTxn
v5 bumps the epoch and answers it, the markers carry it. The Jepsen/Bufstream sequence
(KAFKA-17754): a late ABORT, a late Produce and a late marker of a finished transaction arrive
while the next one runs; each is refused with Kafka's code, and the next transaction commits
exactly its own records. A kill -9 in each state of a V2 transaction resumes it with the bumped
epoch; TV1 clients of the same broker keep TV1 (tests/compat/test_transactions.py)."""
from __future__ import annotations

import asyncio
import time

import pytest
from test_transactions import FAST, batches, call, create_topic, describe, wait_for_markers, wait_for_state

from oncelog.client.aio.connection import Connection
from oncelog.core.txn.read_committed import ReadCommittedFilter
from oncelog.protocol import entities
from oncelog.protocol import produce as produce_wire
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.records import Record, encode_batch
from oncelog.protocol.records.decode import iter_record_batches
from oncelog.testing.broker_login import as_broker
from oncelog.testing.embedded import BrokerProcess

pytestmark = pytest.mark.processes


class RawV2:
    """One transactional id's requests at the versions a Transactions V2 client uses."""

    def __init__(self, bootstrap: str, tid: str, topic: str) -> None:
        self.bs, self.tid, self.topic = bootstrap, tid, topic
        self.pid = self.epoch = -1
        self.seq: dict[int, int] = {}

    def init(self) -> tuple[int, int]:
        deadline = time.monotonic() + 30
        while True:  # the first one creates __transaction_state: COORDINATOR_LOAD_IN_PROGRESS meanwhile
            r = call(self.bs, ApiKey.INIT_PRODUCER_ID, 5, transactional_id=self.tid, transaction_timeout=60000,
                     producer_id=-1, producer_epoch=-1)
            if r.error_code.value not in (E.COORDINATOR_LOAD_IN_PROGRESS, E.CONCURRENT_TRANSACTIONS) \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert r.error_code.value == E.NONE, r
        self.pid, self.epoch, self.seq = int(r.producer_id), int(r.producer_epoch), {}
        return self.pid, self.epoch

    def records(self, partition: int, values: list[bytes], epoch: int | None = None,
                seq: int | None = None) -> bytes:
        base = self.seq.get(partition, 0) if seq is None else seq
        if seq is None:
            self.seq[partition] = base + len(values)
        now = int(time.time() * 1000)
        return bytes(encode_batch([Record(i, now, None, v, []) for i, v in enumerate(values)],
                                  producer_id=self.pid, producer_epoch=self.epoch if epoch is None else epoch,
                                  base_sequence=base, transactional=True))

    def produce(self, parts: dict[int, bytes], version: int = 12) -> dict[int, int]:
        return asyncio.run(_produce(self.bs, version, self.topic, parts, self.tid))

    def end(self, commit: bool, epoch: int | None = None, pid: int | None = None, version: int = 5):
        r = call(self.bs, ApiKey.END_TXN, version, transactional_id=self.tid,
                 producer_id=self.pid if pid is None else pid,
                 producer_epoch=self.epoch if epoch is None else epoch, committed=commit)
        return r

    def commit(self) -> None:
        """EndTxn v5 (retried while the previous transaction completes); the client goes on with
        the answer's producer id and epoch, its sequences from 0."""
        deadline = time.monotonic() + 30
        while True:
            r = self.end(True)
            if r.error_code.value != E.CONCURRENT_TRANSACTIONS or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert r.error_code.value == E.NONE, r
        assert (int(r.producer_id), int(r.producer_epoch)) == (self.pid, self.epoch + 1)
        self.pid, self.epoch, self.seq = int(r.producer_id), int(r.producer_epoch), {}


async def _produce(bootstrap: str, version: int, topic: str, parts: dict[int, bytes], tid: str) -> dict[int, int]:
    host, port = bootstrap.rsplit(":", 1)
    conn = Connection(host, int(port), "txn-v2-test")
    await conn.connect(10)
    try:
        body = produce_wire.encode_request(version, -1, 10000, {topic: list(parts.items())}, transactional_id=tid)
        answer = produce_wire.decode_response(version, await conn.request(ApiKey.PRODUCE, version, body))
        return {p.index: p.error_code for p in answer[0].partitions}
    finally:
        conn.close()


def read_committed(bootstrap: str, topic: str, partition: int) -> list[bytes]:
    """The values a read_committed Fetch returns, aborted transactions filtered as clients do."""
    fp = entities.nested(ApiKey.FETCH, 11, "request", "FetchPartition")
    ft = entities.nested(ApiKey.FETCH, 11, "request", "FetchTopic")
    r = call(bootstrap, ApiKey.FETCH, 11, max_wait=0, min_bytes=0, max_bytes=1 << 24, isolation_level=1,
             topics=(ft(topic=topic, partitions=(fp(partition=partition, fetch_offset=0,
                                                   partition_max_bytes=1 << 24),)),),
             forgotten_topics_data=())
    p = r.responses[0].partitions[0]
    f = ReadCommittedFilter([(int(a.producer_id), int(a.first_offset)) for a in p.aborted_transactions or ()])
    out = []
    for header, records in iter_record_batches(bytes(p.records or b"")):
        if f.accept(header.producer_id, header.last_offset, header.is_transactional, header.is_control,
                    header.is_control and records[0].key[2:4] == b"\x00\x00"):
            out.extend(bytes(rec.value) for rec in records)
    return out


@pytest.fixture
def txn_broker(tmp_path):
    b = BrokerProcess(tmp_path / "data", FAST).start()
    yield b
    b.stop()


def test_produce_v12_adds_its_partitions_and_end_txn_v5_bumps_the_epoch(txn_broker):
    bs, topic = txn_broker.bootstrap, "v2-flow"
    create_topic(bs, topic)
    c = RawV2(bs, "v2-a", topic)
    pid, e = c.init()
    # a TV1 client (Produce v11) that added nothing is refused: only v12+ means "add it for me"
    assert c.produce({0: c.records(0, [b"x"], seq=0)}, version=11) == {0: E.TRANSACTION_ABORTABLE}
    assert c.produce({0: c.records(0, [b"a0"]), 1: c.records(1, [b"a1"])}) == {0: E.NONE, 1: E.NONE}
    d = describe(bs, "v2-a")
    assert d.transaction_state == "Ongoing"
    assert {(t.topic, p) for t in d.topics for p in t.partitions} == {(topic, 0), (topic, 1)}
    r = c.end(True)
    assert (r.error_code.value, int(r.producer_id), int(r.producer_epoch)) == (E.NONE, pid, e + 1)
    wait_for_markers(bs, topic, 0, ["COMMIT"])
    assert [b for b in batches(bs, topic, 0) if b[0] == "COMMIT"] == [("COMMIT", pid, e + 1, ())]
    assert int(wait_for_state(bs, "v2-a", "CompleteCommit").producer_epoch) == e + 1
    assert c.end(True).error_code.value == E.NONE            # a retry (its answer lost): the same answer
    assert int(c.end(True).producer_epoch) == e + 1
    assert c.end(False).error_code.value == E.INVALID_TXN_STATE
    assert read_committed(bs, topic, 0) == [b"a0"] and read_committed(bs, topic, 1) == [b"a1"]


def test_late_abort_produce_and_marker_of_a_finished_transaction_leave_the_next_one_intact(txn_broker):
    """KAFKA-17754's sequence: T1 commits; T2 begins at the same producer id; then T1's ABORT
    (EndTxn v5 and a TV1 EndTxn), a T1 Produce and a T1 ABORT marker arrive late. All are
    refused, and T2 commits exactly its records."""
    bs, topic = txn_broker.bootstrap, "v2-late"
    create_topic(bs, topic)
    c = RawV2(bs, "v2-late", topic)
    pid, e1 = c.init()
    assert c.produce({0: c.records(0, [b"t1-0"]), 1: c.records(1, [b"t1-1"])}) == {0: E.NONE, 1: E.NONE}
    late_batch = c.records(0, [b"t1-late"])            # written by T1, delivered after it ended
    c.commit()
    e2 = c.epoch
    # T2 starts at once: its add waits on the broker for T1's markers (no CONCURRENT_TRANSACTIONS here)
    assert c.produce({0: c.records(0, [b"t2-0"])}) == {0: E.NONE}
    assert c.end(False, epoch=e1).error_code.value == E.PRODUCER_FENCED            # EndTxn v5
    assert c.end(False, epoch=e1, version=3).error_code.value == E.PRODUCER_FENCED  # TV1 EndTxn
    assert c.produce({0: late_batch}) == {0: E.INVALID_PRODUCER_EPOCH}
    marker = entities.nested(ApiKey.WRITE_TXN_MARKERS, 1, "request", "WritableTxnMarker")
    mtopic = entities.nested(ApiKey.WRITE_TXN_MARKERS, 1, "request", "WritableTxnMarkerTopic")

    async def late_marker():
        peer = as_broker(bs, txn_broker.data_dir)
        try:
            return await peer.request(ApiKey.WRITE_TXN_MARKERS, 1, markers=(marker(
                producer_id=pid, producer_epoch=e1, transaction_result=False, coordinator_epoch=0,
                topics=(mtopic(name=topic, partition_indexes=(0,)),)),))
        finally:
            peer.close()
    r = asyncio.run(late_marker())
    assert r.markers[0].topics[0].partitions[0].error_code.value == E.INVALID_PRODUCER_EPOCH
    assert describe(bs, "v2-late").transaction_state == "Ongoing"
    assert c.produce({0: c.records(0, [b"t2-1"]), 1: c.records(1, [b"t2-2"])}) == {0: E.NONE, 1: E.NONE}
    c.commit()
    assert c.epoch == e2 + 1
    wait_for_markers(bs, topic, 0, ["COMMIT", "COMMIT"])
    assert read_committed(bs, topic, 0) == [b"t1-0", b"t2-0", b"t2-1"]
    assert read_committed(bs, topic, 1) == [b"t1-1", b"t2-2"]
    assert all(v != b"t1-late" for b in batches(bs, topic, 0) for v in b[3])


def test_init_producer_id_aborts_an_ongoing_v2_transaction_with_one_bump(txn_broker):
    """A second instance's InitProducerId while a V2 transaction runs: PrepareAbort at e+1
    (markers at e+1), CONCURRENT_TRANSACTIONS, then e+2 (KAFKA-19367: not e+3); the first
    instance's EndTxn and Produce are refused."""
    bs, topic = txn_broker.bootstrap, "v2-fence"
    create_topic(bs, topic, 1)
    zombie = RawV2(bs, "v2-fence", topic)
    pid, e = zombie.init()
    assert zombie.produce({0: zombie.records(0, [b"zombie"])}) == {0: E.NONE}
    fresh = RawV2(bs, "v2-fence", topic)
    assert fresh.init() == (pid, e + 2)
    assert [b[:3] for b in batches(bs, topic, 0)] == [("data", pid, e), ("ABORT", pid, e + 1)]
    assert zombie.end(True).error_code.value == E.PRODUCER_FENCED
    assert zombie.produce({0: zombie.records(0, [b"more"])}) == {0: E.INVALID_PRODUCER_EPOCH}
    assert read_committed(bs, topic, 0) == []


def test_txn_offset_commit_v5_adds_the_groups_offsets_partition(txn_broker):
    bs, topic, group = txn_broker.bootstrap, "v2-offsets", "v2-group"
    create_topic(bs, topic, 1)
    c = RawV2(bs, "v2-offsets", topic)
    c.init()
    assert c.produce({0: c.records(0, [b"out"])}) == {0: E.NONE}
    ot = entities.nested(ApiKey.TXN_OFFSET_COMMIT, 5, "request", "TxnOffsetCommitRequestTopic")
    op = entities.nested(ApiKey.TXN_OFFSET_COMMIT, 5, "request", "TxnOffsetCommitRequestPartition")

    def txn_offset_commit(version: int):
        return call(bs, ApiKey.TXN_OFFSET_COMMIT, version, transactional_id="v2-offsets", group_id=group,
                    producer_id=c.pid, producer_epoch=c.epoch, generation_id=-1, member_id="",
                    group_instance_id=None, topics=(ot(name=topic, partitions=(op(
                        partition_index=0, committed_offset=7, committed_leader_epoch=-1,
                        committed_metadata=""),)),))
    # v4 (TV1) needs AddOffsetsToTxn first; v5 adds the group's __consumer_offsets partition itself
    assert txn_offset_commit(4).topics[0].partitions[0].error_code.value == E.TRANSACTION_ABORTABLE
    assert txn_offset_commit(5).topics[0].partitions[0].error_code.value == E.NONE
    d = describe(bs, "v2-offsets")
    assert any(t.topic == "__consumer_offsets" for t in d.topics)
    c.commit()
    deadline = time.monotonic() + 30
    while True:
        t = entities.nested(ApiKey.OFFSET_FETCH, 7, "request", "OffsetFetchRequestTopic")
        r = call(bs, ApiKey.OFFSET_FETCH, 7, group_id=group, require_stable=True,
                 topics=(t(name=topic, partition_indexes=(0,)),))
        p = r.topics[0].partitions[0]
        if p.error_code.value == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert (p.error_code.value, int(p.committed_offset)) == (0, 7)


@pytest.mark.parametrize("state", ["Empty", "Ongoing", "PrepareCommit", "CompleteCommit", "PrepareAbort"])
def test_kill_9_in_every_state_of_a_v2_transaction_resumes_it_at_the_bumped_epoch(tmp_path, state):
    """A kill -9 with the transaction in `state` (PrepareCommit and PrepareAbort: killed as the
    first marker is written, after the Prepare record was fsynced and answered); after the restart
    the coordinator holds the same state, the markers go out at the bumped epoch, a retried EndTxn
    v5 is answered the bumped epoch, and the next transaction commits."""
    topic, tid = "v2-crash", "v2-crash"
    prepared = state.startswith("Prepare")
    env = {"ONCELOG_FAILPOINTS": f"crash:log:match={topic}-0:after=1"} if prepared else {}
    b = BrokerProcess(tmp_path / "data", FAST, env=env)
    b.start()
    try:
        create_topic(b.bootstrap, topic, 1)
        c = RawV2(b.bootstrap, tid, topic)
        pid, e = c.init()
        if state != "Empty":
            assert c.produce({0: c.records(0, [b"before"])}) == {0: E.NONE}
        if prepared:
            commit = state == "PrepareCommit"
            try:
                r = c.end(commit)
                assert (r.error_code.value, int(r.producer_epoch)) == (E.NONE, e + 1)
            except Exception:  # noqa: BLE001 - the answer may not have left before the kill
                pass
            b.proc.wait(30)
            assert not b.running, "the failpoint did not fire"
            b.env = {}
        elif state == "CompleteCommit":
            c.commit()
            wait_for_state(b.bootstrap, tid, "CompleteCommit")
            b.kill()
        else:
            wait_for_state(b.bootstrap, tid, state)
            b.kill()
        b.start()
        c.bs = b.bootstrap
        if prepared:
            done = "CompleteCommit" if commit else "CompleteAbort"
            d = wait_for_state(c.bs, tid, done)
            assert (int(d.producer_id), int(d.producer_epoch)) == (pid, e + 1)
            # the marker the kill interrupted may be in the log already: the resent one repeats it
            written = {x[:3] for x in batches(c.bs, topic, 0) if x[0] != "data"}
            assert written == {("COMMIT" if commit else "ABORT", pid, e + 1)}
            r = c.end(commit)   # the client's retry of the EndTxn whose answer died with the broker
            assert (r.error_code.value, int(r.producer_id), int(r.producer_epoch)) == (E.NONE, pid, e + 1)
            c.epoch, c.seq = e + 1, {}
        elif state == "CompleteCommit":
            assert int(describe(c.bs, tid).producer_epoch) == e + 1
            r = c.end(True, epoch=e)
            assert (r.error_code.value, int(r.producer_epoch)) == (E.NONE, e + 1)
        else:
            d = describe(c.bs, tid)
            assert (d.transaction_state, int(d.producer_epoch)) == (state, e)
        assert c.produce({0: c.records(0, [b"after"])}) == {0: E.NONE}
        c.commit()
        wait_for_state(c.bs, tid, "CompleteCommit")
        kept = [b"before"] if state in ("Ongoing", "PrepareCommit", "CompleteCommit") else []
        deadline = time.monotonic() + 30
        while read_committed(c.bs, topic, 0) != kept + [b"after"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert read_committed(c.bs, topic, 0) == kept + [b"after"]
    finally:
        b.stop()
