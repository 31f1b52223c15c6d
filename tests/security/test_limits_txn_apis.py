"""Issue 36, resource bounds per principal for the transaction APIs: `mallory` has WRITE on
transactional ids and topics prefixed `mallory-`, READ on those topics and on groups prefixed
`mallory-`, nothing else. What is asserted is each bound's mechanism (the refusal and its code,
what is kept, how much work one step of the event loop does), never a time: bench/txn_flood.py
measures memory, `__transaction_state` growth and another client's ApiVersions latency.

- InitProducerId: an id costs one record and one entry until `transactional.id.expiration.ms`
  (Kafka's bound); the removal sweep writes its tombstones in bounded steps.
- InitProducerId v6 (KIP-939): Enable2Pc needs TWO_PHASE_COMMIT; KeepPreparedTxn keeps the one
  transaction (no entry, partition or record beyond one per keep) until the epoch is exhausted.
- AddPartitionsToTxn: a partition named many times in one request costs as much as once; one
  already in the transaction is not written again.
- AddOffsetsToTxn: the group's offsets partition is written once per transaction.
- EndTxn: the markers of a transaction on many partitions are written a bounded number per step.
- TxnOffsetCommit: metadata longer than `offset.metadata.max.bytes` is refused
  (OFFSET_METADATA_TOO_LARGE), as Kafka does.
- DescribeTransactions: an id repeated in one request is described once (INVALID_REQUEST for the
  repeats); other clients are served between two ids.
- ListTransactions: other clients are served while the ids are authorized.

In-process broker over real sockets (the test's event loop is the broker's), SASL PLAIN users."""
from __future__ import annotations

import asyncio
import time

import pytest
from tests.security.rights_support import create_topic, secured_broker

from oncelog.broker.handlers import list_transactions
from oncelog.core.txn.log_format import TRANSACTION_STATE_TOPIC
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing.raw_client import AsyncRawConnection

K = ApiKey
USERS = {"admin": "admin-pw", "mallory": "mallory-pw", "bob": "bob-pw"}
TOPIC, GROUP, TXN, PREFIXED, LITERAL = 2, 3, 5, 4, 3
READ, WRITE, ALLOW, TWO_PHASE_COMMIT = 3, 4, 3, 15
PARTITIONS = 60


@pytest.fixture
async def secured(tmp_path, request):
    skew = [0.0]   # seconds the broker's clock runs ahead (`broker.skew`): timers fire when a test says
    async with secured_broker(tmp_path / "data", USERS, clock=lambda: time.time() + skew[0], **{
            "transaction.state.log.num.partitions": "2", "offsets.topic.num.partitions": "2",
            "transaction.two.phase.commit.enable": "true", **getattr(request, "param", {})}) as s:
        s.broker.skew = skew
        await create_topic(s, "mallory-t", PARTITIONS)
        await allow(s.admin, (TXN, "mallory-", PREFIXED, WRITE), (TOPIC, "mallory-", PREFIXED, WRITE),
                    (TOPIC, "mallory-", PREFIXED, READ), (GROUP, "mallory-", PREFIXED, READ))
        yield s.broker, s.login, s.admin


async def allow(admin: AsyncRawConnection, *acls) -> None:
    acl = entities.nested(K.CREATE_ACLS, 3, "request", "AclCreation")
    r = await admin.call(K.CREATE_ACLS, 3, creations=tuple(
        acl(resource_type=rtype, resource_name=name, resource_pattern_type=pattern, principal="User:mallory",
            host="*", operation=op, permission_type=ALLOW) for rtype, name, pattern, op in acls))
    assert all(int(x.error_code) == 0 for x in r.results)


async def init(conn: AsyncRawConnection, tid: str, version: int = 4, timeout_ms: int = 60000,
               **fields) -> tuple[int, int, int]:
    """InitProducerId, asked again while the coordinator loads (the first one creates
    `__transaction_state`): (error, producer id, epoch)."""
    for _ in range(200):
        r = await conn.call(K.INIT_PRODUCER_ID, version, transactional_id=tid, transaction_timeout=timeout_ms,
                            producer_id=-1, producer_epoch=-1, **fields)
        if int(r.error_code) not in (E.COORDINATOR_LOAD_IN_PROGRESS, E.COORDINATOR_NOT_AVAILABLE):
            break
        await asyncio.sleep(0.05)
    return int(r.error_code), int(r.producer_id), int(r.producer_epoch)


async def add(conn: AsyncRawConnection, tid: str, pid: int, epoch: int, partitions) -> dict[int, int]:
    """AddPartitionsToTxn v3 of partitions of `mallory-t`: error code -> how many partitions."""
    tp = entities.nested(K.ADD_PARTITIONS_TO_TXN, 3, "request", "AddPartitionsToTxnTopic")
    r = await conn.call(K.ADD_PARTITIONS_TO_TXN, 3, v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid,
                        v3_and_below_producer_epoch=epoch,
                        v3_and_below_topics=(tp(name="mallory-t", partitions=tuple(partitions)),))
    codes: dict[int, int] = {}
    for t in r.results_by_topic_v3_and_below:
        for p in t.results_by_partition:
            codes[int(p.partition_error_code)] = codes.get(int(p.partition_error_code), 0) + 1
    return codes


def txn_log_end(broker, tid: str) -> int:
    """The log end offset of the id's `__transaction_state` partition: one more per record."""
    p = broker.txn.core.partition_of(tid)
    return broker.logs.get_partition(TRANSACTION_STATE_TOPIC, p).log_end_offset


def handled_order(broker, monkeypatch) -> list[int]:
    """The API keys of the requests the broker answers, in the order it answers them."""
    handled: list[int] = []
    observe = broker.metrics.request_handled

    def record(api_key, *args, **kw):
        handled.append(int(api_key))
        return observe(api_key, *args, **kw)

    monkeypatch.setattr(broker.metrics, "request_handled", record)
    return handled


async def answered_before(first, bob: AsyncRawConnection):
    """Send `first` (a coroutine making a request), then bob's ApiVersions; both answers."""
    long = asyncio.ensure_future(first)
    await asyncio.sleep(0)            # the long request is sent first
    versions = asyncio.ensure_future(bob.call(K.API_VERSIONS, 3, client_software_name="t",
                                              client_software_version="1"))
    await versions
    return await long


# ------------------------------------------------------------------ DescribeTransactions

async def test_a_transaction_repeated_in_one_describe_is_described_once(secured):
    broker, login, _admin = secured
    mallory = await login("mallory")
    code, pid, epoch = await init(mallory, "mallory-x")
    assert code == E.NONE
    assert await add(mallory, "mallory-x", pid, epoch, range(PARTITIONS)) == {E.NONE: PARTITIONS}
    r = await mallory.call(K.DESCRIBE_TRANSACTIONS, 0, transactional_ids=("mallory-x",) * 3000 + ("mallory-none",))
    codes = [int(s.error_code) for s in r.transaction_states]
    assert codes[0] == E.NONE and sum(len(t.partitions) for t in r.transaction_states[0].topics) == PARTITIONS
    assert codes[1:3000] == [E.INVALID_REQUEST] * 2999        # no partition listed twice
    assert sum(len(t.partitions) for s in r.transaction_states for t in s.topics) == PARTITIONS
    assert codes[3000] == E.TRANSACTIONAL_ID_NOT_FOUND


async def test_other_clients_are_served_between_two_transactions_of_one_describe(secured, monkeypatch):
    broker, login, _admin = secured
    mallory, bob = await login("mallory"), await login("bob")
    for i in range(20):
        assert (await init(mallory, f"mallory-{i}"))[0] == E.NONE
    handled = handled_order(broker, monkeypatch)
    r = await answered_before(mallory.call(K.DESCRIBE_TRANSACTIONS, 0, transactional_ids=tuple(
        f"mallory-{i}" for i in range(20))), bob)
    assert handled == [K.API_VERSIONS, K.DESCRIBE_TRANSACTIONS], handled   # the order the broker answered them
    assert [int(s.error_code) for s in r.transaction_states] == [E.NONE] * 20


# ------------------------------------------------------------------ ListTransactions

async def test_other_clients_are_served_while_a_list_of_transactions_is_authorized(secured, monkeypatch):
    """Every id the coordinator holds is decided on: the broker answers another client's
    ApiVersions sent after a ListTransactions before it (it decided on every id in one step)."""
    broker, login, _admin = secured
    mallory, bob = await login("mallory"), await login("bob")
    for i in range(100):
        assert (await init(mallory, f"mallory-{i}"))[0] == E.NONE
    monkeypatch.setattr(list_transactions, "CHUNK", 5)
    handled = handled_order(broker, monkeypatch)
    r = await answered_before(mallory.call(K.LIST_TRANSACTIONS, 1, state_filters=(), producer_id_filters=(),
                                           duration_filter=-1), bob)
    assert handled == [K.API_VERSIONS, K.LIST_TRANSACTIONS], handled
    assert len(r.transaction_states) == 100


# ------------------------------------------------------------------ TxnOffsetCommit (and OffsetCommit)

async def committed(admin: AsyncRawConnection, group: str) -> dict[int, int]:
    """The group's committed offsets of `mallory-t`, by partition (-1: none)."""
    r = await admin.call(K.OFFSET_FETCH, 7, group_id=group, topics=None, require_stable=False)
    return {int(p.partition_index): int(p.committed_offset) for t in r.topics if t.name == "mallory-t"
            for p in t.partitions}


async def test_a_transactional_offset_with_metadata_over_the_maximum_is_refused(secured):
    _broker, login, admin = secured
    mallory = await login("mallory")
    code, pid, epoch = await init(mallory, "mallory-o")
    assert code == E.NONE
    r = await mallory.call(K.ADD_OFFSETS_TO_TXN, 3, transactional_id="mallory-o", producer_id=pid,
                           producer_epoch=epoch, group_id="mallory-g")
    assert int(r.error_code) == E.NONE
    tp = entities.nested(K.TXN_OFFSET_COMMIT, 3, "request", "TxnOffsetCommitRequestTopic")
    pp = entities.nested(K.TXN_OFFSET_COMMIT, 3, "request", "TxnOffsetCommitRequestPartition")
    limit = 4096                                           # offset.metadata.max.bytes, Kafka's default
    r = await mallory.call(K.TXN_OFFSET_COMMIT, 3, transactional_id="mallory-o", group_id="mallory-g",
                           producer_id=pid, producer_epoch=epoch, generation_id=-1, member_id="",
                           group_instance_id=None, topics=(tp(name="mallory-t", partitions=tuple(
                               pp(partition_index=i, committed_offset=7, committed_leader_epoch=-1,
                                  committed_metadata="m" * (limit + i)) for i in range(2))),))
    assert [int(p.error_code) for p in r.topics[0].partitions] == [E.NONE, E.OFFSET_METADATA_TOO_LARGE]
    r = await mallory.call(K.END_TXN, 3, transactional_id="mallory-o", producer_id=pid, producer_epoch=epoch,
                           committed=True)
    assert int(r.error_code) == E.NONE
    for _ in range(200):   # the markers follow the answer
        if (await committed(admin, "mallory-g")).get(0) == 7:
            break
        await asyncio.sleep(0.05)
    assert await committed(admin, "mallory-g") == {0: 7}    # the refused partition kept nothing


async def test_an_offset_with_metadata_over_the_maximum_is_refused(secured):
    _broker, login, admin = secured
    mallory = await login("mallory")
    tp = entities.nested(K.OFFSET_COMMIT, 8, "request", "OffsetCommitRequestTopic")
    pp = entities.nested(K.OFFSET_COMMIT, 8, "request", "OffsetCommitRequestPartition")
    r = await mallory.call(K.OFFSET_COMMIT, 8, group_id="mallory-c", generation_id_or_member_epoch=-1, member_id="",
                           group_instance_id=None, topics=(tp(name="mallory-t", partitions=tuple(
                               pp(partition_index=i, committed_offset=5, committed_leader_epoch=-1,
                                  committed_metadata="m" * (4096 + i)) for i in range(2))),))
    assert [int(p.error_code) for p in r.topics[0].partitions] == [E.NONE, E.OFFSET_METADATA_TOO_LARGE]
    assert await committed(admin, "mallory-c") == {0: 5}


# ------------------------------------------------------------------ AddPartitionsToTxn, AddOffsetsToTxn

async def test_a_partition_named_many_times_in_one_add_costs_as_much_as_once(secured, monkeypatch):
    broker, login, _admin = secured
    from oncelog.broker.handlers import add_partitions_to_txn
    checked: list[tuple[str, int]] = []
    exists = add_partitions_to_txn._exists

    def counted(b, topic: str, index: int) -> bool:
        checked.append((topic, index))
        return exists(b, topic, index)

    monkeypatch.setattr(add_partitions_to_txn, "_exists", counted)
    mallory = await login("mallory")
    code, pid, epoch = await init(mallory, "mallory-a")
    assert code == E.NONE
    before = txn_log_end(broker, "mallory-a")
    assert await add(mallory, "mallory-a", pid, epoch, [0, 1] * 100_000) == {E.NONE: 2}   # one answer each
    assert sorted(checked) == [("mallory-t", 0), ("mallory-t", 1)]                      # one check each
    assert txn_log_end(broker, "mallory-a") == before + 1                               # one record
    assert broker.txn.core.get("mallory-a").partitions == {("mallory-t", 0), ("mallory-t", 1)}
    for _ in range(20):   # what the transaction holds already is not written again
        assert await add(mallory, "mallory-a", pid, epoch, [1, 0]) == {E.NONE: 2}
    assert txn_log_end(broker, "mallory-a") == before + 1


async def test_the_offsets_partition_of_a_group_is_written_once_per_transaction(secured):
    broker, login, _admin = secured
    mallory = await login("mallory")
    code, pid, epoch = await init(mallory, "mallory-b")
    assert code == E.NONE
    before = txn_log_end(broker, "mallory-b")
    for _ in range(50):
        r = await mallory.call(K.ADD_OFFSETS_TO_TXN, 3, transactional_id="mallory-b", producer_id=pid,
                               producer_epoch=epoch, group_id="mallory-g")
        assert int(r.error_code) == E.NONE
    assert txn_log_end(broker, "mallory-b") == before + 1
    assert len(broker.txn.core.get("mallory-b").partitions) == 1


# ------------------------------------------------------------------ EndTxn

class LoopSteps:
    """Counts the event loop's iterations: a callback that schedules itself again runs once in each."""

    def __init__(self) -> None:
        self.step, self._stopped = 0, False
        asyncio.get_running_loop().call_soon(self._tick)

    def _tick(self) -> None:
        if not self._stopped:
            self.step += 1
            asyncio.get_running_loop().call_soon(self._tick)

    def stop(self) -> None:
        self._stopped = True


async def test_the_markers_of_a_transaction_on_many_partitions_are_written_a_bounded_number_per_step(
        secured, monkeypatch):
    broker, login, admin = secured
    ct = entities.nested(K.CREATE_TOPICS, 7, "request", "CreatableTopic")
    r = await admin.call(K.CREATE_TOPICS, 7, topics=(
        ct(name="mallory-w", num_partitions=250, replication_factor=1, assignments=(), configs=()),),
        timeout=30000, validate_only=False)
    assert int(r.topics[0].error_code) == 0
    mallory = await login("mallory")
    code, pid, epoch = await init(mallory, "mallory-e")
    assert code == E.NONE
    tp = entities.nested(K.ADD_PARTITIONS_TO_TXN, 3, "request", "AddPartitionsToTxnTopic")
    r = await mallory.call(K.ADD_PARTITIONS_TO_TXN, 3, v3_and_below_transactional_id="mallory-e",
                           v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
                           v3_and_below_topics=(tp(name="mallory-w", partitions=tuple(range(250))),))
    assert {int(p.partition_error_code) for p in r.results_by_topic_v3_and_below[0].results_by_partition} == {0}
    steps, appended = LoopSteps(), []
    write = broker.logs.write_txn_marker

    async def counted(topic, *args, **kw):
        appended.append(steps.step)
        return await write(topic, *args, **kw)

    monkeypatch.setattr(broker.logs, "write_txn_marker", counted)
    r = await mallory.call(K.END_TXN, 3, transactional_id="mallory-e", producer_id=pid, producer_epoch=epoch,
                           committed=True)
    assert int(r.error_code) == E.NONE
    for _ in range(400):   # the markers follow the answer
        if broker.txn.core.get("mallory-e").state.display_name == "CompleteCommit":
            break
        await asyncio.sleep(0.05)
    steps.stop()
    assert len(appended) == 250
    per_step = max(appended.count(s) for s in set(appended))
    assert per_step <= 32, per_step   # marker_writer.LOCAL_MARKERS_PER_STEP (all 250 in one step before)


# ------------------------------------------------------------------ InitProducerId: what an id holds, and for how long

def appends_per_step(broker, monkeypatch, target: str | None = None) -> tuple[LoopSteps, list[int]]:
    """The loop step of every `__transaction_state` append from now on (`target`: only of the
    transitions to that state)."""
    steps, appended = LoopSteps(), []
    append = broker.txn.append

    async def counted(t):
        if target is None or t.target.display_name == target:
            appended.append(steps.step)
        return await append(t)

    monkeypatch.setattr(broker.txn, "append", counted)
    return steps, appended


@pytest.mark.parametrize("secured", [{"transaction.remove.expired.transaction.cleanup.interval.ms": "200"}],
                         indirect=True)
async def test_idle_transactional_ids_expire_and_are_removed_in_bounded_steps(secured, monkeypatch):
    """An id costs an entry and a record until transactional.id.expiration.ms (Kafka's bound: no
    rate or count per principal; `request_percentage` quotas slow a principal down), and the ids
    one principal made expire together: their tombstones are appended a bounded number per step
    (3,000 held the loop 0.28 s in one step)."""
    broker, login, _admin = secured
    mallory = await login("mallory")
    for i in range(120):
        assert (await init(mallory, f"mallory-{i}"))[0] == E.NONE
    steps, appended = appends_per_step(broker, monkeypatch)
    broker.skew[0] = 7 * 24 * 3600 + 60           # past transactional.id.expiration.ms (7 days)
    for _ in range(400):
        if all(broker.txn.core.get(f"mallory-{i}") is None for i in range(120)):
            break
        await asyncio.sleep(0.05)
    steps.stop()
    assert all(broker.txn.core.get(f"mallory-{i}") is None for i in range(120))   # nothing kept
    assert len(appended) == 120                                                      # one tombstone each
    assert max(appended.count(s) for s in set(appended)) <= 32                       # SWEEP_PER_STEP


@pytest.mark.parametrize("secured", [{"transaction.abort.timed.out.transaction.cleanup.interval.ms": "200"}],
                         indirect=True)
async def test_open_transactions_are_aborted_at_their_timeout_in_bounded_steps(secured, monkeypatch):
    """An open transaction holds its partitions (and the last stable offset there) at most
    transaction.max.timeout.ms (INVALID_TRANSACTION_TIMEOUT above it), then is aborted; the
    aborts of transactions that time out together are appended a bounded number per step."""
    broker, login, _admin = secured
    mallory = await login("mallory")
    assert (await init(mallory, "mallory-long", timeout_ms=900_001))[0] == E.INVALID_TRANSACTION_TIMEOUT
    for i in range(80):
        code, pid, epoch = await init(mallory, f"mallory-{i}")
        assert code == E.NONE
        assert await add(mallory, f"mallory-{i}", pid, epoch, (i % PARTITIONS,)) == {E.NONE: 1}
    # the sweep's aborts (the CompleteAbort records follow each one's markers, in whatever step:
    # one of them once shared a step with 32 aborts of the next batch)
    steps, appended = appends_per_step(broker, monkeypatch, target="PrepareAbort")
    broker.skew[0] = 61                            # past their 60 s timeout
    for _ in range(400):
        if all(broker.txn.core.get(f"mallory-{i}").state.display_name == "CompleteAbort" for i in range(80)):
            break
        await asyncio.sleep(0.05)
    steps.stop()
    assert all(broker.txn.core.get(f"mallory-{i}").partitions == frozenset() for i in range(80))
    assert len(appended) == 80                                                       # one abort each
    assert max(appended.count(s) for s in set(appended)) <= 32                       # SWEEP_PER_STEP


async def test_a_two_phase_commit_transaction_is_kept_whole_and_only_with_its_right(secured):
    """InitProducerId v6 (KIP-939): Enable2Pc needs TWO_PHASE_COMMIT beside WRITE (a 2PC
    transaction is never aborted by its timeout: it holds its partitions' last stable offset until
    its manager completes it, which only an administrator's ACL may allow); KeepPreparedTxn keeps
    the one transaction, one record per keep, and is refused once the epoch is exhausted
    (INVALID_TXN_STATE, tests/core/test_txn_coordinator.py)."""
    broker, login, admin = secured
    mallory = await login("mallory")
    assert (await init(mallory, "mallory-2pc", version=6, enable2_pc=True))[0] == \
        E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert broker.txn.core.get("mallory-2pc") is None                       # nothing made
    await allow(admin, (TXN, "mallory-2pc", LITERAL, TWO_PHASE_COMMIT))
    for _ in range(200):   # the broker follows the controller's ACLs
        code, pid, epoch = await init(mallory, "mallory-2pc", version=6, enable2_pc=True)
        if code != E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            break
        await asyncio.sleep(0.05)
    assert code == E.NONE
    assert await add(mallory, "mallory-2pc", pid, epoch, (0,)) == {E.NONE: 1}
    before = txn_log_end(broker, "mallory-2pc")
    for _ in range(30):
        r = await mallory.call(K.INIT_PRODUCER_ID, 6, transactional_id="mallory-2pc", transaction_timeout=60000,
                               producer_id=-1, producer_epoch=-1, enable2_pc=True, keep_prepared_txn=True)
        assert int(r.error_code) == E.NONE and int(r.ongoing_txn_producer_id) == pid
    assert txn_log_end(broker, "mallory-2pc") == before + 30                   # one record per keep
    meta = broker.txn.core.get("mallory-2pc")
    assert meta.state.display_name == "Ongoing" and meta.partitions == {("mallory-t", 0)}
    assert [m.transactional_id for m in broker.txn.core._all()] == ["mallory-2pc"]
