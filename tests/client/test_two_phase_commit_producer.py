"""oncelog's producer as a KIP-939 participant against a real `oncelog serve`:
`prepare_transaction` -> a serializable `PreparedTxnState`; after the producer is gone (its
process died with the transaction prepared), a new producer's
`init_transactions(keep_prepared_txn=True)` keeps the transaction and `complete_transaction`
commits it when the recorded state names it, aborts it otherwise (and says so), while the old
producer is fenced. Under Transactions V2 and V1. Bad input: 2PC calls without the config, a
broker that disables 2PC, the Kafka config pair it refuses."""
from __future__ import annotations

import logging
import time
import uuid

import pytest
from test_txn_producer import FAST, create_topic, oncelog_values

from oncelog.client import PreparedTxnState, Producer
from oncelog.client.errors import ConfigError, ProducerFencedError, TransactionFatalError, TransactionStateError
from oncelog.testing.embedded import BrokerProcess

pytestmark = pytest.mark.processes

TWO_PC = {**FAST, "transaction.two.phase.commit.enable": "true"}


@pytest.fixture(scope="module")
def broker_2pc(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("twopc") / "data", TWO_PC).start()
    yield b
    b.stop()


@pytest.fixture(params=["v2", "v1"])
def protocol(request) -> dict:
    return {} if request.param == "v2" else {"oncelog.transaction.v2.enable": "false"}


def producer(bs: str, tid: str, **conf) -> Producer:
    return Producer({"bootstrap.servers": bs, "transactional.id": tid, "linger.ms": 0,
                     "transaction.two.phase.commit.enable": "true", **conf})


def committed(bs: str, topic: str, expected: list[bytes]) -> list[bytes]:
    """What read_committed reads of `topic`'s two partitions, sorted, once it is `expected` or after
    30 s. EndTxn is answered before the markers are written, as Kafka's is: until the marker of
    a partition lands, its LSO stays at the transaction's first offset and a read sees nothing
    of it there (under load, only v0, v2, v4 of six values, once)."""
    deadline = time.monotonic() + 30
    while True:
        got = sorted(oncelog_values(bs, topic, 2, "read_committed"))
        if got == sorted(expected) or time.monotonic() > deadline:
            return got


def prepared(bs: str, tid: str, topic: str, values: list[bytes], conf: dict) -> tuple[Producer, str]:
    """A producer that sent `values` and prepared: (producer, its state serialized)."""
    p = producer(bs, tid, **conf)
    p.init_transactions(30)
    p.begin_transaction()
    for i, v in enumerate(values):
        p.send(topic, v, partition=i % 2)
    state = p.prepare_transaction(30)
    assert state.has_transaction and PreparedTxnState.parse(str(state)) == state
    with pytest.raises(TransactionStateError):   # prepared: nothing more in it
        p.send(topic, b"late", partition=0)
    return p, str(state)


def test_a_kept_transaction_commits_when_the_recorded_state_names_it(broker_2pc, protocol):
    bs, topic, tid = broker_2pc.bootstrap, f"twopc-{uuid.uuid4().hex[:6]}", f"tx-{uuid.uuid4().hex[:6]}"
    create_topic(bs, topic)
    values = [f"v{i}".encode() for i in range(6)]
    old, recorded = prepared(bs, tid, topic, values, protocol)
    assert oncelog_values(bs, topic, 2, "read_committed") == []
    # the manager restarts: keeps the transaction, compares, commits
    new = producer(bs, tid, **protocol)
    new.init_transactions(30, keep_prepared_txn=True)
    assert str(new.prepared_transaction) == recorded
    with pytest.raises(TransactionStateError):   # only completing it is allowed now
        new.begin_transaction()
    assert new.complete_transaction(recorded, 30) is True
    assert committed(bs, topic, values) == sorted(values)
    # the producer that prepared it was fenced by the keep
    with pytest.raises((ProducerFencedError, TransactionFatalError)):
        old.complete_transaction(PreparedTxnState.parse(recorded), 30)
    old.close(5)
    # the new producer goes on with ordinary transactions
    new.begin_transaction()
    new.send(topic, b"after", partition=0)
    new.commit_transaction(30)
    assert committed(bs, topic, [*values, b"after"]) == sorted([*values, b"after"])
    # a restart with nothing open: nothing kept, nothing to complete
    again = producer(bs, tid, **protocol)
    again.init_transactions(30, keep_prepared_txn=True)
    assert again.prepared_transaction is None
    assert again.complete_transaction(recorded, 30) is None
    for p in (new, again):
        p.close(5)


def test_a_stale_recorded_state_aborts_the_kept_transaction_and_says_so(broker_2pc, caplog):
    bs, topic, tid = broker_2pc.bootstrap, f"twopc-{uuid.uuid4().hex[:6]}", f"tx-{uuid.uuid4().hex[:6]}"
    create_topic(bs, topic)
    old, recorded = prepared(bs, tid, topic, [b"a", b"b"], {})
    stale = PreparedTxnState(PreparedTxnState.parse(recorded).producer_id, PreparedTxnState.parse(recorded).epoch + 7)
    new = producer(bs, tid)
    new.init_transactions(30, keep_prepared_txn=True)
    with caplog.at_level(logging.WARNING, logger="oncelog.client.transactions"):
        assert new.complete_transaction(stale, 30) is False
    assert "does not match the open transaction" in caplog.text
    assert oncelog_values(bs, topic, 2, "read_committed") == []
    assert sorted(oncelog_values(bs, topic, 2, "read_uncommitted")) == [b"a", b"b"]
    for p in (old, new):
        p.close(5)


def test_init_without_keep_aborts_what_was_prepared(broker_2pc):
    bs, topic, tid = broker_2pc.bootstrap, f"twopc-{uuid.uuid4().hex[:6]}", f"tx-{uuid.uuid4().hex[:6]}"
    create_topic(bs, topic)
    old, _recorded = prepared(bs, tid, topic, [b"gone"], {})
    new = producer(bs, tid)
    new.init_transactions(30)
    assert new.prepared_transaction is None
    new.begin_transaction()
    new.send(topic, b"kept", partition=1)
    new.commit_transaction(30)
    assert committed(bs, topic, [b"kept"]) == [b"kept"]
    for p in (old, new):
        p.close(5)


def test_bad_input(tmp_path, broker_2pc):
    with pytest.raises(ConfigError):   # Kafka's ProducerConfig refuses the pair
        producer(broker_2pc.bootstrap, "tx-bad", **{"transaction.timeout.ms": "1000"})
    with pytest.raises(ConfigError):
        Producer({"bootstrap.servers": broker_2pc.bootstrap, "transaction.two.phase.commit.enable": "true"})
    plain = Producer({"bootstrap.servers": broker_2pc.bootstrap, "transactional.id": "tx-plain"})
    with pytest.raises(TransactionStateError):
        plain.init_transactions(30, keep_prepared_txn=True)
    plain.init_transactions(30)
    plain.begin_transaction()
    with pytest.raises(TransactionStateError):
        plain.prepare_transaction(30)
    plain.close(5)
    # a broker with transaction.two.phase.commit.enable=false (Kafka's default): fatal, with its code
    off = BrokerProcess(tmp_path / "off", FAST).start()
    try:
        p = producer(off.bootstrap, "tx-off")
        with pytest.raises(TransactionFatalError, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED"):
            p.init_transactions(30)
        p.close(5)
    finally:
        off.stop()
