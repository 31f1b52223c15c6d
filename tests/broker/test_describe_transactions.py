"""DescribeTransactions answers as Kafka's TransactionCoordinator.handleDescribeTransactions does
(issue 36): the start time of a transactional id with no transaction started is -1 (Kafka's
txnStartTimestamp; Kafka's admin client reads it as "no start time", where 0 showed a
transaction running since 1970), and an error entry holds the generated class's defaults, the
only values Kafka sets being the id and the code: state "", timeout 0, start time 0, producer id 0
and epoch 0 (oncelog sent -1 for the producer id and epoch). Raw requests to an in-process broker;
the answer's bytes are read by `protocol.describe_transactions` (kio refuses a negative time)."""
from __future__ import annotations

import pytest
from test_dedup_raw import Conn
from tests.security.rights_support import init_producer_id

from oncelog.broker.config import BrokerConfig
from oncelog.protocol import describe_transactions as wire
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing.in_process import InProcessBroker

K = ApiKey.DESCRIBE_TRANSACTIONS


@pytest.fixture
async def conn(tmp_path):
    b = InProcessBroker(BrokerConfig({"log.dirs": str(tmp_path / "data"), "node.id": "1",
                                      "listeners": "PLAINTEXT://127.0.0.1:0"}))
    host, port = (await b.start())[:2]
    c = await Conn.open(host, port)
    yield c
    await c.close()
    await b.stop()


async def _init(c: Conn, tid: str) -> int:
    r = await init_producer_id(c, tid)
    assert int(r.error_code) == E.NONE, r
    return int(r.producer_id)


async def test_a_transactional_id_with_no_transaction_started_has_start_time_minus_one(conn):
    pid = await _init(conn, "idle")
    body = await conn.exchange(K, 0, entities.encode(entities.make(
        entities.entity_class(K, 0, "request"), transactional_ids=("idle",))))
    assert body == wire.encode_response(0, [wire.encode_state(E.NONE, "idle", "Empty", 60000, -1, pid, 0, [])])
    (state,) = entities.decode_response(K, 0, body).transaction_states
    assert state.transaction_start_time is None and entities.millis(state.transaction_start_time) == -1


async def test_an_error_entry_holds_kafkas_values(conn):
    await _init(conn, "known")
    body = await conn.exchange(K, 0, entities.encode(entities.make(
        entities.entity_class(K, 0, "request"), transactional_ids=("unknown", "known", "known"))))
    states = entities.decode_response(K, 0, body).transaction_states
    assert [int(s.error_code) for s in states] == [E.TRANSACTIONAL_ID_NOT_FOUND, E.NONE, E.INVALID_REQUEST]
    for s in (states[0], states[2]):
        assert (s.transaction_state, entities.millis(s.transaction_timeout), entities.millis(s.transaction_start_time),
                int(s.producer_id), int(s.producer_epoch), s.topics) == ("", 0, 0, 0, 0, ())
