"""Producer.resume_transaction: another process ends a transaction by (transactional id,
producer id, epoch) without InitProducerId, as the Spark sink's driver does with the
transactions its tasks left open (Flink's resumeTransaction), against a real `oncelog serve`;
under Transactions V2 (the driver's EndTxn v5 at the task's epoch, which the coordinator bumps)
and V1 (`oncelog.transaction.v2.enable=false` in task and driver)."""
from __future__ import annotations

import pytest
from test_txn_producer import FAST, ck_values, create_topic, oncelog_values, txn_producer

from oncelog.client.errors import ProducerFencedError, TransactionFatalError, TransactionStateError
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode
from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.raw_client import RawConnection

pytestmark = pytest.mark.processes


@pytest.fixture
def txn_broker(tmp_path):
    b = BrokerProcess(tmp_path / "data", FAST).start()
    yield b
    b.stop()


_PROTOCOL: dict[str, str] = {}


@pytest.fixture(autouse=True, params=["v2", "v1"])
def protocol(request):
    """Task and driver speak Transactions V2 (the default) or V1."""
    _PROTOCOL.clear()
    if request.param == "v1":
        _PROTOCOL["oncelog.transaction.v2.enable"] = "false"
    return request.param


def _producer(bs: str, tid: str):
    return txn_producer(bs, tid, **_PROTOCOL)


def _prepare(bs: str, tid: str, topic: str, values: list[bytes]) -> tuple:
    """A producer that sent `values` in an open transaction and was left as it is (its
    process died, or it handed the transaction on): (producer, producer id, epoch)."""
    p = _producer(bs, tid)
    p.init_transactions(30)
    p.begin_transaction()
    for i, v in enumerate(values):
        p.send(topic, v, partition=i % 2)
    p.flush(30)
    return (p, *p.transaction_ids)


def _end(bs: str, tid: str, pid: int, epoch: int, commit: bool) -> None:
    with _producer(bs, tid) as d:
        d.resume_transaction(pid, epoch)
        with pytest.raises(TransactionStateError):
            d.send("anything", b"x", partition=0)
        (d.commit_transaction if commit else d.abort_transaction)(30)


def test_a_resumed_transaction_commits_and_a_retried_commit_succeeds(txn_broker, protocol):
    bs, topic = txn_broker.bootstrap, "resumed"
    create_topic(bs, topic)
    values = [f"r{i}".encode() for i in range(8)]
    task, pid, epoch = _prepare(bs, "tx-resume", topic, values)
    assert oncelog_values(bs, topic, 2, "read_committed") == []
    _end(bs, "tx-resume", pid, epoch, commit=True)
    _end(bs, "tx-resume", pid, epoch, commit=True)    # the same commit again: NONE
    d = RawConnection(bs).call(ApiKey.DESCRIBE_TRANSACTIONS, 0, transactional_ids=("tx-resume",))
    state = d.transaction_states[0]   # V2: the driver's EndTxn v5 bumped the task's epoch
    assert (state.transaction_state, int(state.producer_epoch)) == (
        "CompleteCommit", epoch + 1 if protocol == "v2" else epoch)
    assert sorted(ck_values(bs, topic, 2, "read_committed", 8)) == sorted(values)
    assert sorted(oncelog_values(bs, topic, 2, "read_committed")) == sorted(values)
    task.close(5)


def test_a_resumed_commit_of_an_aborted_or_fenced_transaction_raises(txn_broker):
    bs, topic = txn_broker.bootstrap, "resumed-fenced"
    create_topic(bs, topic)
    task, pid, epoch = _prepare(bs, "tx-aborted", topic, [b"a1", b"a2"])
    _end(bs, "tx-aborted", pid, epoch, commit=False)
    with pytest.raises(TransactionFatalError) as e:
        _end(bs, "tx-aborted", pid, epoch, commit=True)
    assert e.value.code == ErrorCode.INVALID_TXN_STATE
    task.close(5)

    # a later InitProducerId (a retried task attempt) fences the transaction and aborts it
    task, pid, epoch = _prepare(bs, "tx-fenced", topic, [b"f1", b"f2"])
    with _producer(bs, "tx-fenced") as retry:
        retry.init_transactions(30)
    with pytest.raises(ProducerFencedError):
        _end(bs, "tx-fenced", pid, epoch, commit=True)
    task.close(5)
    assert oncelog_values(bs, topic, 2, "read_committed") == []
    assert len(oncelog_values(bs, topic, 2, "read_uncommitted")) == 4
