"""A paused broker changes nothing it no longer owns (issue 34): the two ways a SIGSTOP of one
broker of `serve --brokers 2` broke exactly-once, replayed with raw requests, and a batch that
would have opened a transaction its coordinator never registered.

1. A late `__consumer_offsets` marker. Broker 1 coordinates the transactional id and the group;
   broker 2 is paused before T1's EndTxn. The marker T1's coordinator sent broker 2 waits in its
   socket; T1 completes without it, T2 (Transactions V2: the epoch T1's marker carries) commits
   offsets, and broker 2 resumes with T1's marker. It must settle nothing of T2's: T2's offsets
   stay pending until T2's own marker (a committed offset that T2's abort leaves behind loses
   input; an abort marker that drops T2's offsets before T2 commits copies input twice).
2. A fenced KIP-848 member commits through the old coordinator. Member B owns both partitions
   at broker 2, the group's coordinator; broker 2 is paused with B's TxnOffsetCommit in its
   socket; broker 1 takes the group over, fences B, gives A both partitions, A commits 200.
   Broker 2 resumes: B's stale commit must be refused, the group's offset never goes back to
   B's, and A keeps the group.
3. Append-time verification (Kafka's `batchMissingRequiredVerification`): a Produce with a batch
   for a partition where the producer's transaction is open and one that waits for the
   coordinator's verification; a marker ends the open transaction meanwhile. The first batch
   may not open a new transaction there that the coordinator never registered.

Every wait polls with a deadline; the pauses are real SIGSTOP/SIGCONT of broker processes.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
import uuid
import zlib
from collections.abc import Callable
from typing import Any

import pytest

from oncelog.core.txn.log_format import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, partition_for
from oncelog.protocol import entities, headers
from oncelog.protocol import produce as wire_produce
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.records import Record, encode_batch
from oncelog.testing.broker_login import as_broker
from oncelog.testing.cluster import LocalCluster
from oncelog.testing.raw_client import RawConnection

pytestmark = pytest.mark.processes

OFFSETS_PARTITIONS = 50
GROUPS = {"group.consumer.min.session.timeout.ms": "1000", "group.consumer.session.timeout.ms": "3000",
          "group.consumer.min.heartbeat.interval.ms": "100", "group.consumer.heartbeat.interval.ms": "300"}


@pytest.fixture
def cluster(tmp_path):
    c = LocalCluster(tmp_path, 2, {"transaction.state.log.num.partitions": "1", **GROUPS}, proxies=False).start()
    yield c
    for b in c.brokers.values():   # a test that failed while a broker was stopped must not hang the stop
        if b.running:
            os.kill(b.proc.pid, signal.SIGCONT)
    c.stop()


def eventually(check: Callable[[], Any], what: str, timeout_s: float = 30, every_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what} (last: {result!r})")
        time.sleep(every_s)


def pause(cluster: LocalCluster, i: int) -> None:
    os.kill(cluster.brokers[i].proc.pid, signal.SIGSTOP)


def resume(cluster: LocalCluster, i: int) -> None:
    """SIGCONT, then two round trips on new connections: whatever waited in the broker's
    sockets was read (and handled up to its first wait) before they were answered."""
    os.kill(cluster.brokers[i].proc.pid, signal.SIGCONT)
    for _ in range(2):
        with RawConnection(cluster.brokers[i].bootstrap, timeout_s=30) as c:
            assert c.api_versions() == 0


class Raw:
    """Requests to one broker, decoded; `send`/`receive` leave a request waiting in a socket."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.conn = RawConnection(address, timeout_s=30)

    def call(self, api: int, version: int, **fields) -> Any:
        return self.conn.call(api, version, **fields)

    def send(self, api: int, version: int, **fields) -> int:
        body = entities.encode(entities.make(entities.entity_class(api, version, "request"), **fields))
        return self.conn.send(api, version, body)

    def receive(self, api: int, version: int) -> Any:
        frame = self.conn.recv_frame()
        return entities.decode_response(api, version, frame[headers.response_header_size(api, version, frame):])

    def close(self) -> None:
        self.conn.close()


def coordinator(raw: Raw, key: str, key_type: int) -> int:
    """FindCoordinator v4's node for the key, -1 while none answers."""
    r = raw.call(ApiKey.FIND_COORDINATOR, 4, key_type=key_type, coordinator_keys=(key,))
    c = r.coordinators[0]
    return int(c.node_id) if c.error_code.value == E.NONE else -1


def topics(raw: Raw) -> dict[str, list[tuple[int, int]]]:
    """name -> [(leader, leader epoch)] per partition (Metadata v12, every topic)."""
    r = raw.call(ApiKey.METADATA, 12, topics=None, allow_auto_topic_creation=False,
                 include_topic_authorized_operations=False)
    return {str(t.name): [(int(p.leader_id), int(p.leader_epoch))
                          for p in sorted(t.partitions, key=lambda p: int(p.partition_index))]
            for t in r.topics}


def group_on(wanted: int, prefix: str) -> str:
    """A group id whose coordinator is broker `wanted` before any placement: groups of a
    two-broker cluster went by a hash of their id over the live brokers."""
    return next(g for g in (f"{prefix}-{i}" for i in itertools.count()) if zlib.crc32(g.encode()) % 2 == wanted - 1)


def place_group(cluster: LocalCluster, raw: Raw, group: str, broker: int) -> None:
    """Broker `broker` coordinates `group`: the leader of the group's `__consumer_offsets`
    partition is moved there when the topic exists (groups follow it), and FindCoordinator
    answers it."""
    eventually(lambda: coordinator(raw, group, 0) >= 0, f"a coordinator for {group}")
    if CONSUMER_OFFSETS_TOPIC in topics(raw):
        assert cluster.move_leader(CONSUMER_OFFSETS_TOPIC, partition_for(group, OFFSETS_PARTITIONS), broker) == 0
    eventually(lambda: coordinator(raw, group, 0) == broker, f"broker {broker} coordinating {group}")


def place_transaction_state(cluster: LocalCluster, raw: Raw, tid: str, broker: int) -> None:
    eventually(lambda: coordinator(raw, tid, 1) >= 0, "__transaction_state")   # created by the first ask
    assert cluster.move_leader(TRANSACTION_STATE_TOPIC, 0, broker) == 0
    eventually(lambda: coordinator(raw, tid, 1) == broker, f"broker {broker} coordinating {tid}")


class TxnProducer:
    """A transactional producer of raw requests; Transactions V2 (EndTxn v5, TxnOffsetCommit v5)
    unless `v1`."""

    def __init__(self, raw: Raw, tid: str) -> None:
        self.raw, self.tid = raw, tid
        self.pid = self.epoch = -1
        self.seq: dict[tuple[str, int], int] = {}

    def init(self) -> None:
        def attempt():
            r = self.raw.call(ApiKey.INIT_PRODUCER_ID, 4, transactional_id=self.tid, transaction_timeout=60000,
                              producer_id=-1, producer_epoch=-1)
            return r if r.error_code.value == E.NONE else None
        r = eventually(attempt, f"InitProducerId({self.tid})")
        self.pid, self.epoch = int(r.producer_id), int(r.producer_epoch)

    def offsets_fields(self, group: str, topic: str, offsets: dict[int, int], generation: int = -1,
                       member: str = "") -> dict[str, Any]:
        t = entities.nested(ApiKey.TXN_OFFSET_COMMIT, 5, "request", "TxnOffsetCommitRequestTopic")
        p = entities.nested(ApiKey.TXN_OFFSET_COMMIT, 5, "request", "TxnOffsetCommitRequestPartition")
        return dict(transactional_id=self.tid, group_id=group, producer_id=self.pid, producer_epoch=self.epoch,
                    generation_id=generation, member_id=member, group_instance_id=None,
                    topics=(t(name=topic, partitions=tuple(p(partition_index=i, committed_offset=o,
                                                             committed_leader_epoch=-1, committed_metadata="")
                                                           for i, o in sorted(offsets.items()))),))

    def commit_offsets(self, raw: Raw, group: str, topic: str, offsets: dict[int, int], **member) -> int:
        """TxnOffsetCommit v5 (the offsets partition joins the transaction): its first code."""
        r = raw.call(ApiKey.TXN_OFFSET_COMMIT, 5, **self.offsets_fields(group, topic, offsets, **member))
        return int(r.topics[0].partitions[0].error_code.value)

    def end(self, commit: bool) -> int:
        """EndTxn v5: the producer takes the bumped epoch the answer carries."""
        r = self.raw.call(ApiKey.END_TXN, 5, transactional_id=self.tid, producer_id=self.pid,
                          producer_epoch=self.epoch, committed=commit)
        if r.error_code.value == E.NONE:
            self.pid, self.epoch = int(r.producer_id), int(r.producer_epoch)
        return int(r.error_code.value)

    def state(self) -> str:
        r = self.raw.call(ApiKey.DESCRIBE_TRANSACTIONS, 0, transactional_ids=(self.tid,))
        return str(r.transaction_states[0].transaction_state)

    def completed(self, timeout_s: float = 60) -> str:
        return eventually(lambda: (s := self.state()) in ("CompleteCommit", "CompleteAbort", "Empty") and s,
                          f"{self.tid} complete", timeout_s)


def create_topic(raw: Raw, name: str, partitions: int) -> None:
    r = raw.call(ApiKey.CREATE_TOPICS, 7, topics=(entities.make(
        entities.nested(ApiKey.CREATE_TOPICS, 7, "request", "CreatableTopic"), name=name, num_partitions=partitions,
        replication_factor=1, assignments=(), configs=()),), timeout=30000, validate_only=False)
    assert r.topics[0].error_code.value == E.NONE, r


def committed(raw: Raw, group: str, topic: str, partition: int) -> int:
    t = entities.nested(ApiKey.OFFSET_FETCH, 7, "request", "OffsetFetchRequestTopic")
    r = raw.call(ApiKey.OFFSET_FETCH, 7, group_id=group, require_stable=False,
                 topics=(t(name=topic, partition_indexes=(partition,)),))
    assert r.error_code.value == E.NONE, r
    p = r.topics[0].partitions[0]
    assert p.error_code.value == E.NONE, p
    return int(p.committed_offset)


# ---------------------------------------------------------------------------------- finding 1

@pytest.mark.parametrize("first_commits", [True, False], ids=["T1-commit-T2-abort", "T1-abort-T2-commit"])
def test_a_late_offsets_marker_settles_nothing_of_the_next_transaction(cluster, first_commits):
    b1 = Raw(cluster.brokers[1].bootstrap)
    group, topic = group_on(1, "copy"), "in"
    create_topic(b1, topic, 1)
    p = TxnProducer(b1, "late-marker")
    place_transaction_state(cluster, b1, p.tid, 1)
    place_group(cluster, b1, group, 1)
    p.init()
    # T0 commits offset 5: its marker reaches both brokers (the connection to broker 2 is warm)
    assert p.commit_offsets(b1, group, topic, {0: 5}) == E.NONE
    assert p.end(commit=True) == E.NONE
    assert p.completed() == "CompleteCommit"
    assert eventually(lambda: committed(b1, group, topic, 0) == 5, "T0's offset")
    pause(cluster, 2)
    try:
        # T1, its marker for broker 2 left in broker 2's socket; T1 completes without it
        assert p.commit_offsets(b1, group, topic, {0: 10}) == E.NONE
        assert p.end(commit=first_commits) == E.NONE
        assert p.completed() == ("CompleteCommit" if first_commits else "CompleteAbort")
        # T2 at the epoch T1's marker carries (Transactions V2 bumps at every EndTxn)
        assert p.commit_offsets(b1, group, topic, {0: 20}) == E.NONE
    finally:
        resume(cluster, 2)
    settled = 10 if first_commits else 5
    assert committed(b1, group, topic, 0) == settled, "T1's late marker settled T2's offsets"
    assert p.end(commit=not first_commits) == E.NONE
    p.completed()
    assert eventually(lambda: committed(b1, group, topic, 0) == (settled if first_commits else 20),
                      "the group's offset after T2", timeout_s=10)


# ---------------------------------------------------------------------------------- finding 2

class Member:
    """A KIP-848 member of raw ConsumerGroupHeartbeat v1 requests."""

    def __init__(self, group: str, topic: str) -> None:
        self.group, self.topic = group, topic
        self.member_id, self.epoch = str(uuid.uuid4()), 0
        self.owned: dict[uuid.UUID, set[int]] = {}

    def heartbeat(self, raw: Raw) -> int:
        tp = entities.nested(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, "request", "TopicPartitions")
        extra = {"rebalance_timeout": 30000, "subscribed_topic_names": (self.topic,)} if self.epoch == 0 else {}
        r = raw.call(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, group_id=self.group, member_id=self.member_id,
                     member_epoch=self.epoch, instance_id=None,
                     topic_partitions=tuple(tp(topic_id=t, partitions=tuple(sorted(ps)))
                                            for t, ps in self.owned.items() if ps), **extra)
        if r.error_code.value == E.NONE:
            self.epoch = int(r.member_epoch)
            if r.assignment is not None:
                self.owned = {t.topic_id: set(t.partitions) for t in r.assignment.topic_partitions}
        return int(r.error_code.value)

    def partitions(self) -> set[int]:
        return {p for ps in self.owned.values() for p in ps}

    def owns_all(self, raw: Raw, n: int) -> bool:
        code = self.heartbeat(raw)
        assert code in (E.NONE, E.NOT_COORDINATOR, E.COORDINATOR_NOT_AVAILABLE), E(code)
        return code == E.NONE and self.partitions() == set(range(n))


def group_epoch(raw: Raw, group: str) -> int:
    r = raw.call(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, group_ids=(group,), include_authorized_operations=False)
    g = r.groups[0]
    assert g.error_code.value == E.NONE, g
    return int(g.group_epoch)


def test_a_fenced_member_commits_nothing_through_the_old_coordinator(cluster):
    b1, b2 = Raw(cluster.brokers[1].bootstrap), Raw(cluster.brokers[2].bootstrap)
    group, topic = group_on(2, "copiers"), "in"
    create_topic(b1, topic, 2)
    pa, pb = TxnProducer(b1, "copier-a"), TxnProducer(b1, "copier-b")
    place_transaction_state(cluster, b1, pa.tid, 1)
    pa.init()
    pb.init()
    place_group(cluster, b1, group, 2)
    b = Member(group, topic)
    eventually(lambda: b.owns_all(b2, 2), "B owning both partitions at broker 2")
    pause(cluster, 2)
    try:
        # B's commit of in-1 = 150 waits in the paused coordinator's socket
        stale = Raw(cluster.brokers[2].bootstrap)
        stale.send(ApiKey.TXN_OFFSET_COMMIT, 5, **pb.offsets_fields(group, topic, {1: 150}, generation=b.epoch,
                                                                    member=b.member_id))
        eventually(lambda: coordinator(b1, group, 0) == 1, "broker 1 coordinating the group")
        a = Member(group, topic)
        eventually(lambda: a.owns_all(b1, 2), "A owning both partitions at broker 1 (B fenced)", every_s=0.3)
        assert pa.commit_offsets(b1, group, topic, {0: 100, 1: 200}, generation=a.epoch,
                                 member=a.member_id) == E.NONE
        assert pa.end(commit=True) == E.NONE
        pa.completed()
        eventually(lambda: committed(b1, group, topic, 1) == 200, "A's committed offset")
        seen_epoch = group_epoch(b1, group)
    finally:
        resume(cluster, 2)
    answer = stale.receive(ApiKey.TXN_OFFSET_COMMIT, 5)
    code = int(answer.topics[0].partitions[0].error_code.value)
    assert code != E.NONE, "the paused coordinator took a fenced member's commit"
    pb.end(commit=True)   # whatever it answers, nothing of B's may be committed
    pb.completed()
    for _ in range(5):    # heartbeats of A across the old coordinator's return
        assert a.heartbeat(b1) == E.NONE and a.partitions() == {0, 1}
        assert group_epoch(b1, group) >= seen_epoch
        assert committed(b1, group, topic, 1) == 200, "the group's offset went back to the fenced member's"
        time.sleep(0.3)   # one heartbeat interval: the member's own rhythm, not a wait for state


# ---------------------------------------------------------------------------------- finding 3

def test_a_batch_whose_transaction_ended_while_another_was_verified_opens_none(cluster):
    """Transactions V1: the coordinator (broker 1) is paused while broker 2 verifies the second
    partition of a Produce; a COMMIT marker ends the transaction in the first partition
    meanwhile (sent as the coordinator would). The first partition's batch is refused and no
    transaction is open there afterwards."""
    b1, b2 = Raw(cluster.brokers[1].bootstrap), Raw(cluster.brokers[2].bootstrap)
    topic = "data"
    create_topic(b1, topic, 2)
    p = TxnProducer(b1, "verified")
    place_transaction_state(cluster, b1, p.tid, 1)
    for i in (0, 1):
        assert cluster.move_leader(topic, i, 2) == 0
    eventually(lambda: [leader for leader, _e in topics(b1).get(topic, [])] == [2, 2], "broker 2 leading both")
    p.init()
    add = entities.nested(ApiKey.ADD_PARTITIONS_TO_TXN, 3, "request", "AddPartitionsToTxnTopic")
    r = b1.call(ApiKey.ADD_PARTITIONS_TO_TXN, 3, v3_and_below_transactional_id=p.tid,
                v3_and_below_producer_id=p.pid, v3_and_below_producer_epoch=p.epoch,
                v3_and_below_topics=(add(name=topic, partitions=(0, 1)),))
    assert all(x.partition_error_code.value == E.NONE for t in r.results_by_topic_v3_and_below
               for x in t.results_by_partition)

    def batch(partition: int, value: bytes) -> bytes:
        seq = p.seq.get((topic, partition), 0)
        p.seq[(topic, partition)] = seq + 1
        return bytes(encode_batch([Record(0, int(time.time() * 1000), None, value, [])], producer_id=p.pid,
                                  producer_epoch=p.epoch, base_sequence=seq, transactional=True))

    def produce(parts: dict[int, bytes]) -> int:
        body = wire_produce.encode_request(9, -1, 30000, {topic: sorted(parts.items())}, transactional_id=p.tid)
        return b2.conn.send(ApiKey.PRODUCE, 9, body)

    def produce_answer() -> dict[int, int]:
        frame = b2.conn.recv_frame()
        (t,) = wire_produce.decode_response(9, frame, headers.response_header_size(ApiKey.PRODUCE, 9, frame))
        return {p.index: p.error_code for p in t.partitions}

    produce({0: batch(0, b"first")})   # opens the transaction in data-0 (verified with broker 1)
    assert produce_answer() == {0: E.NONE}
    coordinator_epoch = topics(b1)[TRANSACTION_STATE_TOPIC][0][1]
    peer = as_broker(cluster.brokers[2].bootstrap, cluster.data)
    pause(cluster, 1)
    try:
        produce({0: batch(0, b"second"), 1: batch(1, b"other")})   # data-1 waits for broker 1's answer
        mod = entities.module(ApiKey.WRITE_TXN_MARKERS, 1, "request")
        marker = entities.make(mod.WritableTxnMarker, producer_id=p.pid, producer_epoch=p.epoch,
                               transaction_result=True, coordinator_epoch=coordinator_epoch, topics=(
                                   entities.make(mod.WritableTxnMarkerTopic, name=topic, partition_indexes=(0,)),))
        r = asyncio.run(_once(peer.request(ApiKey.WRITE_TXN_MARKERS, 1, markers=(marker,)), peer))
        assert r.markers[0].topics[0].partitions[0].error_code.value == E.NONE
    finally:
        os.kill(cluster.brokers[1].proc.pid, signal.SIGCONT)
    codes = produce_answer()
    assert codes[0] != E.NONE, "a batch opened a transaction its coordinator never registered"
    t = entities.nested(ApiKey.DESCRIBE_PRODUCERS, 0, "request", "TopicRequest")
    r = b2.call(ApiKey.DESCRIBE_PRODUCERS, 0, topics=(t(name=topic, partition_indexes=(0,)),))
    (state,) = [s for s in r.topics[0].partitions[0].active_producers if int(s.producer_id) == p.pid]
    assert int(state.current_txn_start_offset) == -1


async def _once(request, client):
    try:
        return await request
    finally:
        client.close()


# ---------------------------------------------------------------------------------- the controller paused

def test_a_paused_controller_declares_no_broker_dead_for_its_own_silence(cluster):
    """Brokers cannot heartbeat to a stopped controller: when it resumes, that silence is its
    own, and the partitions stay where they were, at their epochs."""
    b1 = Raw(cluster.brokers[1].bootstrap)
    create_topic(b1, "steady", 2)
    assert cluster.move_leader("steady", 0, 1) == 0 and cluster.move_leader("steady", 1, 2) == 0
    before = eventually(lambda: (t := topics(b1).get("steady")) and [x[0] for x in t] == [1, 2] and t,
                        "steady led by brokers 1 and 2")
    os.kill(cluster.controller.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(6)   # the fault itself: three session timeouts (2 s) of the controller stopped
    finally:
        os.kill(cluster.controller.proc.pid, signal.SIGCONT)
    deadline = time.monotonic() + 4   # two session timeouts after it resumed
    while time.monotonic() < deadline:
        assert topics(b1)["steady"] == before
        time.sleep(0.1)
