"""Markers on `__consumer_offsets` take the producer-epoch and coordinator-epoch checks a data
partition takes (Kafka appends them to the offsets partition through the same producer state):
a stale marker, refused on the transaction's data partition, is refused on its offsets partition
in the same WriteTxnMarkers request, and the transaction's pending offsets stay pending until its
real marker settles them.

Raw requests to an in-process broker with real files: InitProducerId, AddPartitionsToTxn,
Produce, AddOffsetsToTxn, TxnOffsetCommit and EndTxn (v3, TV1: an EndTxn does not bump the epoch)
play the transactional producer; WriteTxnMarkers, sent as another broker of the cluster (the only
principal allowed to), plays a late or deposed coordinator.
"""
from __future__ import annotations

import asyncio
import time

import pytest
from test_dedup_raw import Conn, parse_produce, produce_body
from test_transactions_partition import with_txn_id

from oncelog.broker.cluster.controller_client import ControllerClient
from oncelog.broker.config import BrokerConfig
from oncelog.core.txn.log_format import CONSUMER_OFFSETS_TOPIC, partition_for
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.records import Record, encode_batch
from oncelog.testing.broker_login import as_broker
from oncelog.testing.in_process import InProcessBroker

TOPIC, GROUP, TID = "data", "copier", "stale-markers"
OFFSETS_PARTITION = partition_for(GROUP, 50)


class Producer:
    """One transactional producer speaking raw requests on its own connection."""

    def __init__(self, conn: Conn, peer: ControllerClient, broker: InProcessBroker) -> None:
        self.conn, self.peer, self.broker = conn, peer, broker
        self.pid, self.epoch, self.seq = -1, -1, 0

    async def call(self, api: int, version: int, **fields):
        req = entities.make(entities.entity_class(api, version, "request"), **fields)
        return await self.conn.kio(req, entities.entity_class(api, version, "response"))

    async def init(self) -> None:
        """InitProducerId, again with the current (pid, epoch) once there is one: a bump."""
        deadline = time.monotonic() + 30
        while True:  # the first one creates __transaction_state: COORDINATOR_LOAD_IN_PROGRESS meanwhile
            r = await self.call(ApiKey.INIT_PRODUCER_ID, 3, transactional_id=TID, transaction_timeout=60000,
                                producer_id=self.pid, producer_epoch=self.epoch)
            if r.error_code.value != E.COORDINATOR_LOAD_IN_PROGRESS or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        assert r.error_code.value == E.NONE, r
        self.pid, self.epoch, self.seq = int(r.producer_id), int(r.producer_epoch), 0

    async def transaction(self, offset: int) -> None:
        """A record to the data partition and `offset` as the group's pending offset for it."""
        topic = entities.nested(ApiKey.ADD_PARTITIONS_TO_TXN, 3, "request", "AddPartitionsToTxnTopic")
        r = await self.call(ApiKey.ADD_PARTITIONS_TO_TXN, 3, v3_and_below_transactional_id=TID,
                            v3_and_below_producer_id=self.pid, v3_and_below_producer_epoch=self.epoch,
                            v3_and_below_topics=(topic(name=TOPIC, partitions=(0,)),))
        assert r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code.value == E.NONE
        records = encode_batch([Record(0, int(time.time() * 1000), None, b"%d" % offset, [])],
                               producer_id=self.pid, producer_epoch=self.epoch, base_sequence=self.seq,
                               transactional=True)
        body = with_txn_id(produce_body(9, TOPIC, 0, bytes(records)), 9, TID)
        assert parse_produce(9, await self.conn.raw(ApiKey.PRODUCE, 9, body, True))[0]["error_code"] == E.NONE
        self.seq += 1
        r = await self.call(ApiKey.ADD_OFFSETS_TO_TXN, 3, transactional_id=TID, producer_id=self.pid,
                            producer_epoch=self.epoch, group_id=GROUP)
        assert r.error_code.value == E.NONE
        t = entities.nested(ApiKey.TXN_OFFSET_COMMIT, 3, "request", "TxnOffsetCommitRequestTopic")
        p = entities.nested(ApiKey.TXN_OFFSET_COMMIT, 3, "request", "TxnOffsetCommitRequestPartition")
        r = await self.call(ApiKey.TXN_OFFSET_COMMIT, 3, transactional_id=TID, group_id=GROUP, producer_id=self.pid,
                            producer_epoch=self.epoch, generation_id=-1, member_id="", group_instance_id=None,
                            topics=(t(name=TOPIC, partitions=(p(partition_index=0, committed_offset=offset,
                                                                committed_leader_epoch=-1,
                                                                committed_metadata=""),)),))
        assert r.topics[0].partitions[0].error_code.value == E.NONE

    async def offset_commit_v5(self, offset: int, epoch: int) -> int:
        """TxnOffsetCommit v5 (Transactions V2: the broker adds the offsets partition) of `offset`
        at `epoch`: its code."""
        t = entities.nested(ApiKey.TXN_OFFSET_COMMIT, 5, "request", "TxnOffsetCommitRequestTopic")
        p = entities.nested(ApiKey.TXN_OFFSET_COMMIT, 5, "request", "TxnOffsetCommitRequestPartition")
        r = await self.call(ApiKey.TXN_OFFSET_COMMIT, 5, transactional_id=TID, group_id=GROUP, producer_id=self.pid,
                            producer_epoch=epoch, generation_id=-1, member_id="", group_instance_id=None,
                            topics=(t(name=TOPIC, partitions=(p(partition_index=0, committed_offset=offset,
                                                                committed_leader_epoch=-1,
                                                                committed_metadata=""),)),))
        return r.topics[0].partitions[0].error_code.value

    async def end(self, commit: bool) -> None:
        r = await self.call(ApiKey.END_TXN, 3, transactional_id=TID, producer_id=self.pid,
                            producer_epoch=self.epoch, committed=commit)
        assert r.error_code.value == E.NONE
        deadline = time.monotonic() + 30
        while (state := await self.state()) not in ("CompleteCommit", "CompleteAbort"):
            assert time.monotonic() < deadline, state
            await asyncio.sleep(0.02)

    async def state(self) -> str:
        r = await self.call(ApiKey.DESCRIBE_TRANSACTIONS, 0, transactional_ids=(TID,))
        return r.transaction_states[0].transaction_state

    async def marker(self, epoch: int, coordinator_epoch: int, commit: bool,
                     transaction_version: int = 0) -> dict[str, int]:
        """A WriteTxnMarkers for the data partition and the group's offsets partition: each one's
        code. v1, or v2 (KIP-1228) when `transaction_version` is given."""
        version = 2 if transaction_version else 1
        mod = entities.module(ApiKey.WRITE_TXN_MARKERS, version, "request")
        extra = {"transaction_version": transaction_version} if transaction_version else {}
        marker = entities.make(mod.WritableTxnMarker, producer_id=self.pid, producer_epoch=epoch,
                               transaction_result=commit, coordinator_epoch=coordinator_epoch, topics=(
                                   entities.make(mod.WritableTxnMarkerTopic, name=TOPIC, partition_indexes=(0,)),
                                   entities.make(mod.WritableTxnMarkerTopic, name=CONSUMER_OFFSETS_TOPIC,
                                                 partition_indexes=(OFFSETS_PARTITION,))), **extra)
        r = await self.peer.request(ApiKey.WRITE_TXN_MARKERS, version, markers=(marker,))
        return {str(t.name): t.partitions[0].error_code.value for t in r.markers[0].topics}

    async def coordinator_epoch(self) -> int:
        """The coordinator epoch the data partition holds for the producer (DescribeProducers)."""
        t = entities.nested(ApiKey.DESCRIBE_PRODUCERS, 0, "request", "TopicRequest")
        r = await self.call(ApiKey.DESCRIBE_PRODUCERS, 0, topics=(t(name=TOPIC, partition_indexes=(0,)),))
        (state,) = [s for s in r.topics[0].partitions[0].active_producers if int(s.producer_id) == self.pid]
        return int(state.coordinator_epoch)

    async def committed(self, require_stable: bool = False) -> tuple[int, int]:
        """OffsetFetch v7 of the group's offset for the data partition: (error code, offset)."""
        t = entities.nested(ApiKey.OFFSET_FETCH, 7, "request", "OffsetFetchRequestTopic")
        r = await self.call(ApiKey.OFFSET_FETCH, 7, group_id=GROUP, require_stable=require_stable,
                            topics=(t(name=TOPIC, partition_indexes=(0,)),))
        p = r.topics[0].partitions[0]
        return p.error_code.value, int(p.committed_offset)


@pytest.fixture
async def producer(tmp_path):
    broker = InProcessBroker(BrokerConfig({"log.dirs": str(tmp_path / "data"), "listeners": "PLAINTEXT://127.0.0.1:0",
                                           "transaction.state.log.num.partitions": "1"}))
    host, port = (await broker.start())[:2]
    conn = await Conn.open(host, port)
    peer = as_broker(f"{host}:{port}", tmp_path / "data")
    p = Producer(conn, peer, broker)
    ct = entities.nested(ApiKey.CREATE_TOPICS, 7, "request", "CreatableTopic")
    r = await p.call(ApiKey.CREATE_TOPICS, 7, timeout=10000, validate_only=False, topics=(
        ct(name=TOPIC, num_partitions=1, replication_factor=1, assignments=(), configs=()),))
    assert r.topics[0].error_code.value == E.NONE
    await p.init()
    yield p
    peer.close()
    await conn.close()
    await broker.stop()


async def test_a_stale_abort_cannot_drop_the_offsets_of_a_later_transaction(producer):
    """A marker of the producer's previous epoch arrives while its next transaction's offsets are
    pending: refused on both partitions; the transaction then commits its offsets."""
    p = producer
    stale = p.epoch
    await p.init()                                   # a restarted producer: the epoch is bumped
    await p.transaction(20)
    assert await p.marker(stale, 0, commit=False) == {TOPIC: E.INVALID_PRODUCER_EPOCH,
                                                      CONSUMER_OFFSETS_TOPIC: E.INVALID_PRODUCER_EPOCH}
    assert await p.committed(require_stable=True) == (E.UNSTABLE_OFFSET_COMMIT, -1)
    await p.end(commit=True)
    assert await p.committed() == (E.NONE, 20)


async def test_a_stale_commit_cannot_commit_the_offsets_of_a_later_transaction(producer):
    p = producer
    await p.transaction(10)
    await p.end(commit=True)
    stale = p.epoch
    await p.init()
    await p.transaction(20)
    assert await p.marker(stale, 0, commit=True) == {TOPIC: E.INVALID_PRODUCER_EPOCH,
                                                     CONSUMER_OFFSETS_TOPIC: E.INVALID_PRODUCER_EPOCH}
    assert await p.committed() == (E.NONE, 10)
    await p.end(commit=False)
    assert await p.committed() == (E.NONE, 10)


async def test_a_deposed_coordinators_commit_cannot_commit_the_offsets_of_a_later_transaction(producer):
    """Same producer epoch (TV1 keeps it across transactions), older coordinator epoch: the marker
    of a coordinator that lost the transactional id is TRANSACTION_COORDINATOR_FENCED."""
    p = producer
    await p.transaction(10)
    await p.end(commit=True)
    deposed = await p.coordinator_epoch() - 1
    await p.transaction(20)
    assert await p.marker(p.epoch, deposed, commit=True) == {
        TOPIC: E.TRANSACTION_COORDINATOR_FENCED, CONSUMER_OFFSETS_TOPIC: E.TRANSACTION_COORDINATOR_FENCED}
    assert await p.committed(require_stable=True) == (E.UNSTABLE_OFFSET_COMMIT, -1)
    assert await p.committed() == (E.NONE, 10)
    await p.end(commit=False)
    assert await p.committed(require_stable=True) == (E.NONE, 10)


async def test_the_previous_transactions_marker_does_not_void_a_transactions_v2_offset_commit(producer):
    """Transactions V2: the next transaction's TxnOffsetCommit (at the epoch EndTxn bumped to)
    waits for its verification while the previous transaction's marker, at that same epoch,
    lands on the offsets partition: it ended the transaction before, so the commit is stored
    (Kafka's `updateProducers` keeps a TV2 guard through a marker at its epoch). Before, it was
    refused TRANSACTION_ABORTABLE and the transaction aborted. The marker that ends the commit's
    own transaction (above its epoch) makes the offset visible."""
    p = producer
    deadline = time.monotonic() + 30
    while (await p.committed())[0] != E.NONE:         # the group's coordinator loads
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    release, asked = asyncio.Event(), []

    async def verifier(tid, pid, epoch, partitions, add):
        asked.append((pid, epoch, add))
        await release.wait()
        return dict.fromkeys(partitions, E.NONE)
    p.broker.txn_check = verifier
    epoch = p.epoch + 1
    commit = asyncio.create_task(p.offset_commit_v5(30, epoch))
    while not asked:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    assert asked == [(p.pid, epoch, True)]
    assert (await p.marker(epoch, 0, commit=True, transaction_version=2))[CONSUMER_OFFSETS_TOPIC] == E.NONE  # previous
    release.set()
    assert await commit == E.NONE
    assert await p.committed(require_stable=True) == (E.UNSTABLE_OFFSET_COMMIT, -1)
    assert (await p.marker(epoch + 1, 0, commit=True, transaction_version=2))[CONSUMER_OFFSETS_TOPIC] == E.NONE
    assert await p.committed(require_stable=True) == (E.NONE, 30)


# ------------------------------------------------------------------ one transaction, two versions
# A client may mix Transactions V1 requests (AddOffsetsToTxn v3, EndTxn v3: no epoch bump) with V2
# ones (TxnOffsetCommit v5, Produce v12) in one transaction. Then the V1 EndTxn's markers carry the
# transaction's own epoch, and must void the V2 checks of that same transaction still waiting
# (found by a review of the change above: such a check was kept, its batch appended after its own
# transaction's abort marker, its offsets stored pending for ever, then committed by the next
# transaction's marker). The checks here are held after the coordinator's real answer.


def _hold_after_answer(broker):
    real, release, answered = broker.txn_check, asyncio.Event(), asyncio.Event()

    async def held(tid, pid, epoch, tps, add):
        codes = await real(tid, pid, epoch, tps, add)
        answered.set()
        await release.wait()
        return codes
    broker.txn_check = held
    return release, answered


async def _same_producer_elsewhere(p: Producer) -> Producer:
    """The producer on a second connection (one connection serves one request at a time)."""
    host, port = p.conn.writer.get_extra_info("peername")[:2]
    q = Producer(await Conn.open(host, port), p.peer, p.broker)
    q.pid, q.epoch = p.pid, p.epoch
    return q


async def _coordinator_loaded(p: Producer) -> None:
    deadline = time.monotonic() + 30
    while (await p.committed())[0] != E.NONE:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def _add_offsets_v3(p: Producer) -> None:
    r = await p.call(ApiKey.ADD_OFFSETS_TO_TXN, 3, transactional_id=TID, producer_id=p.pid,
                     producer_epoch=p.epoch, group_id=GROUP)
    assert r.error_code.value == E.NONE


def _produce_v12(p: Producer, seq: int = 0) -> asyncio.Task:
    records = encode_batch([Record(0, int(time.time() * 1000), None, b"x", [])], producer_id=p.pid,
                           producer_epoch=p.epoch, base_sequence=seq, transactional=True)
    body = with_txn_id(produce_body(12, TOPIC, 0, bytes(records)), 12, TID)
    return asyncio.create_task(p.conn.raw(ApiKey.PRODUCE, 12, body, True))


async def test_a_v1_abort_voids_the_v2_offset_commit_of_its_own_transaction(producer):
    p = producer
    await _coordinator_loaded(p)
    await _add_offsets_v3(p)                          # T1 at epoch E, V1: its EndTxn will not bump
    release, answered = _hold_after_answer(p.broker)
    commit = asyncio.create_task(p.offset_commit_v5(30, p.epoch))   # a V2 check at E
    await asyncio.wait_for(answered.wait(), 10)
    await (await _same_producer_elsewhere(p)).end(commit=False)     # T1's ABORT at E lands meanwhile
    release.set()
    assert await commit == E.TRANSACTION_ABORTABLE
    assert await p.committed(require_stable=True) == (E.NONE, -1)   # nothing left pending
    await _add_offsets_v3(p)                          # T2, same epoch, commits no offsets of its own
    await p.end(commit=True)
    assert await p.committed(require_stable=True) == (E.NONE, -1)   # and did not commit T1's


async def test_a_v1_abort_voids_the_v2_batch_of_its_own_transaction(producer):
    """The transaction starts V1 (AddOffsetsToTxn v3); Produce v12 adds the data partition (the
    coordinator labels the transaction V2); EndTxn v3 aborts it at the same epoch while the batch
    waits: the markers must say V1 (they bumped nothing) and the batch be refused, not appended
    after its own transaction's marker (a transaction open on the partition that nobody ends)."""
    p = producer
    await _coordinator_loaded(p)
    await _add_offsets_v3(p)
    release, answered = _hold_after_answer(p.broker)
    produce = _produce_v12(p)
    await asyncio.wait_for(answered.wait(), 10)
    await (await _same_producer_elsewhere(p)).end(commit=False)   # returns once CompleteAbort
    release.set()
    assert parse_produce(12, await produce)[0]["error_code"] == E.TRANSACTION_ABORTABLE
    assert p.broker.logs.get_partition(TOPIC, 0).txns.open_transactions() == []


async def test_a_v1_end_of_a_transaction_labelled_v2_completes_and_the_next_ones_run(producer):
    """A batch of Produce v12 (an implicit add: the transaction is labelled V2), ended by EndTxn
    v3 at its own epoch: its markers must say V1. Before, they said V2 at the open transaction's
    epoch, which the partition's strict V2 rule refused (INVALID_PRODUCER_EPOCH): the transaction
    stayed in PrepareCommit for good and the partition's last stable offset with it (found by a
    review). The transactions after it, V2 and V1, end normally."""
    p = producer
    await _coordinator_loaded(p)
    e = p.epoch
    partition = p.broker.logs.get_partition(TOPIC, 0)

    async def produce_v12(seq: int) -> int:
        return parse_produce(12, await _produce_v12(p, seq))[0]["error_code"]

    async def completed(expect: str) -> None:
        deadline = time.monotonic() + 30
        while (state := await p.state()) != expect:
            assert time.monotonic() < deadline, state
            await asyncio.sleep(0.02)
        assert partition.txns.open_transactions() == []

    async def end(version: int, commit: bool) -> tuple[int, int]:
        r = await p.call(ApiKey.END_TXN, version, transactional_id=TID, producer_id=p.pid,
                         producer_epoch=p.epoch, committed=commit)
        return r.error_code.value, int(getattr(r, "producer_epoch", p.epoch))

    assert await produce_v12(0) == E.NONE
    assert (await end(3, commit=True))[0] == E.NONE
    await completed("CompleteCommit")
    assert await produce_v12(1) == E.NONE            # the next one, V2 all the way: bumps
    assert await end(5, commit=True) == (E.NONE, e + 1)
    await completed("CompleteCommit")
    p.epoch = e + 1
    assert await produce_v12(0) == E.NONE            # V2 add, V1 end again, at e + 1
    assert (await end(3, commit=False))[0] == E.NONE
    await completed("CompleteAbort")
    await p.transaction(5)                           # and a V1 transaction after it
    await p.end(commit=True)
    assert await p.committed() == (E.NONE, 5)
