"""Producer.resume_transaction: another process ends a transaction by (transactional id,
producer id, epoch) without InitProducerId, as the Spark sink's driver does with the
transactions its tasks left open (Flink's resumeTransaction), against a real `oncelog serve`."""
from __future__ import annotations

import pytest
from test_txn_producer import FAST, ck_values, create_topic, oncelog_values, txn_producer

from oncelog.client.errors import ProducerFencedError, TransactionFatalError, TransactionStateError
from oncelog.protocol.errors import ErrorCode
from oncelog.testing.embedded import BrokerProcess

pytestmark = pytest.mark.processes


@pytest.fixture
def txn_broker(tmp_path):
    b = BrokerProcess(tmp_path / "data", FAST).start()
    yield b
    b.stop()


def _prepare(bs: str, tid: str, topic: str, values: list[bytes]) -> tuple:
    """A producer that sent `values` in an open transaction and was left as it is (its
    process died, or it handed the transaction on): (producer, producer id, epoch)."""
    p = txn_producer(bs, tid)
    p.init_transactions(30)
    p.begin_transaction()
    for i, v in enumerate(values):
        p.send(topic, v, partition=i % 2)
    p.flush(30)
    return (p, *p.transaction_ids)


def _end(bs: str, tid: str, pid: int, epoch: int, commit: bool) -> None:
    with txn_producer(bs, tid) as d:
        d.resume_transaction(pid, epoch)
        with pytest.raises(TransactionStateError):
            d.send("anything", b"x", partition=0)
        (d.commit_transaction if commit else d.abort_transaction)(30)


def test_a_resumed_transaction_commits_and_a_retried_commit_succeeds(txn_broker):
    bs, topic = txn_broker.bootstrap, "resumed"
    create_topic(bs, topic)
    values = [f"r{i}".encode() for i in range(8)]
    task, pid, epoch = _prepare(bs, "tx-resume", topic, values)
    assert oncelog_values(bs, topic, 2, "read_committed") == []
    _end(bs, "tx-resume", pid, epoch, commit=True)
    _end(bs, "tx-resume", pid, epoch, commit=True)    # the same commit again: NONE
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
    with txn_producer(bs, "tx-fenced") as retry:
        retry.init_transactions(30)
    with pytest.raises(ProducerFencedError):
        _end(bs, "tx-fenced", pid, epoch, commit=True)
    task.close(5)
    assert oncelog_values(bs, topic, 2, "read_committed") == []
    assert len(oncelog_values(bs, topic, 2, "read_uncommitted")) == 4
