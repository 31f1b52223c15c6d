"""KIP-939's broker side against a real `oncelog serve`, with raw InitProducerId v6 requests
(no released Kafka client sends them): a two-phase-commit transaction outlives its timeout and a
kill -9 of the broker, and a restarted producer keeps it with KeepPreparedTxn, is told the id and
epoch it was prepared at, and commits it at the bumped epoch (which fences the old producer);
Kafka's error codes for Enable2Pc where the broker disables it and for KeepPreparedTxn without it.
The TWO_PHASE_COMMIT ACL is in test_authorization.py; ordinary transactions still time out
(test_transactions.py::test_the_sweeper_aborts_a_transaction_left_open_past_its_timeout).
"""
from __future__ import annotations

import asyncio
import time

import pytest
from test_transactions import FAST, _produce, batches, call, create_topic, describe, wait_for_markers

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.records import Record, encode_batch
from oncelog.testing.embedded import BrokerProcess

pytestmark = pytest.mark.processes

TWO_PC = {**FAST, "transaction.two.phase.commit.enable": "true",
          "transaction.abort.timed.out.transaction.cleanup.interval.ms": "100"}
TIMEOUT_MS = 1000   # asked for, and ignored for a 2PC transaction (Kafka ignores it too)


def init(bs: str, tid: str, *, enable_2pc: bool = True, keep: bool = False, version: int = 6):
    deadline = time.monotonic() + 30
    while True:  # the first one creates __transaction_state: COORDINATOR_LOAD_IN_PROGRESS meanwhile
        r = call(bs, ApiKey.INIT_PRODUCER_ID, version, transactional_id=tid, transaction_timeout=TIMEOUT_MS,
                 producer_id=-1, producer_epoch=-1, enable2_pc=enable_2pc, keep_prepared_txn=keep)
        if r.error_code.value not in (E.COORDINATOR_LOAD_IN_PROGRESS, E.CONCURRENT_TRANSACTIONS) \
                or time.monotonic() > deadline:
            return r
        time.sleep(0.05)


def open_transaction(bs: str, tid: str, topic: str, pid: int, epoch: int, values: list[bytes]) -> None:
    t = entities.nested(ApiKey.ADD_PARTITIONS_TO_TXN, 3, "request", "AddPartitionsToTxnTopic")
    r = call(bs, ApiKey.ADD_PARTITIONS_TO_TXN, 3, v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid,
             v3_and_below_producer_epoch=epoch, v3_and_below_topics=(t(name=topic, partitions=(0,)),))
    assert r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code.value == E.NONE
    now = int(time.time() * 1000)
    records = bytes(encode_batch([Record(i, now, None, v, []) for i, v in enumerate(values)], producer_id=pid,
                                 producer_epoch=epoch, base_sequence=0, transactional=True))
    assert asyncio.run(_produce(bs, 9, topic, records, tid)) == E.NONE


def end_txn(bs: str, tid: str, pid: int, epoch: int, commit: bool) -> int:
    return call(bs, ApiKey.END_TXN, 3, transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                committed=commit).error_code.value


def committed_values(bs: str, topic: str) -> list[bytes]:
    """What read_committed readers see: data batches followed by their producer's COMMIT."""
    out, pending = [], {}
    for kind, pid, _epoch, values in batches(bs, topic, 0):
        if kind == "data":
            pending.setdefault(pid, []).extend(values)
        elif kind == "COMMIT":
            out.extend(pending.pop(pid, []))
        else:
            pending.pop(pid, None)
    return out


def test_enable_2pc_is_refused_where_the_broker_disables_it(tmp_path):
    b = BrokerProcess(tmp_path / "data", FAST).start()   # transaction.two.phase.commit.enable: Kafka's false
    try:
        r = init(b.bootstrap, "tx-2pc-off")
        assert r.error_code.value == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        assert init(b.bootstrap, "tx-2pc-off", enable_2pc=False).error_code.value == E.NONE
    finally:
        b.stop()


def test_a_prepared_2pc_transaction_outlives_its_timeout_and_a_kill_9_and_is_kept_and_committed(tmp_path):
    b = BrokerProcess(tmp_path / "data", TWO_PC).start()
    try:
        bs, topic, tid = b.bootstrap, "twopc", "tx-2pc"
        create_topic(bs, topic, 1)
        # bad input first: KeepPreparedTxn without Enable2Pc, or without a transactional id
        assert init(bs, tid, enable_2pc=False, keep=True).error_code.value == E.INVALID_REQUEST
        r = call(bs, ApiKey.INIT_PRODUCER_ID, 6, transactional_id=None, transaction_timeout=TIMEOUT_MS,
                 producer_id=-1, producer_epoch=-1, keep_prepared_txn=True)
        assert r.error_code.value == E.INVALID_REQUEST
        r = init(bs, tid)
        assert r.error_code.value == E.NONE, r
        pid, epoch = int(r.producer_id), int(r.producer_epoch)
        assert (int(r.ongoing_txn_producer_id), int(r.ongoing_txn_producer_epoch)) == (-1, -1)
        open_transaction(bs, tid, topic, pid, epoch, [b"a", b"b", b"c"])
        d = describe(bs, tid)
        assert (d.transaction_state, int(d.transaction_timeout.total_seconds() * 1000)) == ("Ongoing", 2**31 - 1)

        # 3x the timeout it asked for, the sweeper running every 100 ms: still open
        time.sleep(3 * TIMEOUT_MS / 1000)
        assert describe(bs, tid).transaction_state == "Ongoing"

        b.restart(clean=False)   # kill -9
        bs = b.bootstrap
        r = init(bs, tid, keep=True)
        assert r.error_code.value == E.NONE, r
        assert (int(r.ongoing_txn_producer_id), int(r.ongoing_txn_producer_epoch)) == (pid, epoch)
        assert (int(r.producer_id), int(r.producer_epoch)) == (pid, epoch + 1)
        assert describe(bs, tid).transaction_state == "Ongoing"
        assert committed_values(bs, topic) == []

        # a second crash of the manager before it completes: the transaction's own epoch again
        b.restart(clean=False)
        bs = b.bootstrap
        r = init(bs, tid, keep=True)
        assert (int(r.ongoing_txn_producer_id), int(r.ongoing_txn_producer_epoch)) == (pid, epoch)
        new_epoch = int(r.producer_epoch)
        assert new_epoch == epoch + 2
        # the producer that prepared it is fenced; the new one commits it
        assert end_txn(bs, tid, pid, epoch, True) == E.PRODUCER_FENCED
        assert end_txn(bs, tid, pid, new_epoch, True) == E.NONE
        wait_for_markers(bs, topic, 0, ["COMMIT"])
        assert committed_values(bs, topic) == [b"a", b"b", b"c"]

        # nothing kept: KeepPreparedTxn with no open transaction answers -1/-1
        r = init(bs, tid, keep=True)
        assert r.error_code.value == E.NONE
        assert (int(r.ongoing_txn_producer_id), int(r.ongoing_txn_producer_epoch)) == (-1, -1)
    finally:
        b.stop()


def test_without_keep_prepared_a_restart_aborts_the_2pc_transaction(tmp_path):
    b = BrokerProcess(tmp_path / "data", TWO_PC).start()
    try:
        bs, topic, tid = b.bootstrap, "twopc-abort", "tx-2pc-abort"
        create_topic(bs, topic, 1)
        r = init(bs, tid)
        pid, epoch = int(r.producer_id), int(r.producer_epoch)
        open_transaction(bs, tid, topic, pid, epoch, [b"x"])
        b.restart(clean=False)
        bs = b.bootstrap
        r = init(bs, tid, keep=False)   # KIP-939: KeepPreparedTxn=false aborts, as InitProducerId always did
        assert r.error_code.value == E.NONE
        assert (int(r.ongoing_txn_producer_id), int(r.ongoing_txn_producer_epoch)) == (-1, -1)
        wait_for_markers(bs, topic, 0, ["ABORT"])
        assert committed_values(bs, topic) == []
    finally:
        b.stop()
