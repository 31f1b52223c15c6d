"""DescribeTransactionsResponse written by hand (`protocol.describe_transactions`) is byte for
byte what kio writes for the same values, error entries with Kafka's values, and read by hand as
kio reads it, a start time of -1 included."""
from __future__ import annotations

import datetime

from kio.serial import entity_reader

from oncelog.protocol import describe_transactions as wire
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E

K = ApiKey.DESCRIBE_TRANSACTIONS


def _kio_response(start_ms: int = 1_700_000_000_123) -> bytes:
    rb = entities.ResponseBuilder(K, 0)
    topics = [("orders", list(range(2000))), ("é" * 40, [7, 3])]
    return rb.encode(throttle_time=0, transaction_states=(
        rb("TransactionState", error_code=E.NONE, transactional_id="t-1", transaction_state="Ongoing",
           transaction_timeout=datetime.timedelta(milliseconds=60000),
           transaction_start_time=datetime.datetime.fromtimestamp(start_ms / 1000, datetime.UTC),
           producer_id=2**40, producer_epoch=3,
           topics=tuple(rb("TopicData", topic=t, partitions=tuple(ps)) for t, ps in topics)),
        rb("TransactionState", error_code=E.NONE, transactional_id="t-2", transaction_state="Empty",
           transaction_timeout=datetime.timedelta(milliseconds=1), transaction_start_time=0, producer_id=5,
           producer_epoch=0, topics=()),
        # an error entry as Kafka writes it: its generated class's defaults (zeros, not -1)
        rb("TransactionState", error_code=E.INVALID_REQUEST, transactional_id="t-1", transaction_state="",
           transaction_timeout=0, transaction_start_time=0, producer_id=0, producer_epoch=0, topics=())))


def test_the_hand_written_response_is_kios():
    topics = [("orders", list(range(2000))), ("é" * 40, [7, 3])]
    got = wire.encode_response(0, [
        wire.encode_state(E.NONE, "t-1", "Ongoing", 60000, 1_700_000_000_123, 2**40, 3, topics),
        wire.encode_state(E.NONE, "t-2", "Empty", 1, 0, 5, 0, []),
        wire.encode_error(E.INVALID_REQUEST, "t-1")])
    assert got == _kio_response()


def test_the_response_is_read_as_kio_reads_it_and_a_start_time_of_minus_one_as_none():
    """kio refuses a negative timestamp; Kafka sends -1 for a transactional id with no transaction
    started, and so does oncelog: the hand-written reader gives None (millis: -1 again)."""
    body = _kio_response()
    assert entities.decode_response(K, 0, body) == entity_reader(entities.entity_class(K, 0, "response"))(body, 0)[0]
    none_started = wire.encode_response(0, [wire.encode_state(E.NONE, "t-3", "Empty", 60000, -1, 9, 0, [])])
    (state,) = entities.decode_response(K, 0, none_started).transaction_states
    assert state.transaction_start_time is None and entities.millis(state.transaction_start_time) == -1
    assert (state.transactional_id, state.transaction_state, int(state.producer_id)) == ("t-3", "Empty", 9)
