"""DescribeTransactionsResponse written by hand (`protocol.describe_transactions`) is byte for
byte what kio writes, error entries included."""
from __future__ import annotations

import datetime

from oncelog.protocol import describe_transactions as wire
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E

K = ApiKey.DESCRIBE_TRANSACTIONS


def test_the_hand_written_response_is_kios():
    rb = entities.ResponseBuilder(K, 0)
    topics = [("orders", list(range(2000))), ("é" * 40, [7, 3])]
    expected = rb.encode(throttle_time=0, transaction_states=(
        rb("TransactionState", error_code=E.NONE, transactional_id="t-1", transaction_state="Ongoing",
           transaction_timeout=datetime.timedelta(milliseconds=60000),
           transaction_start_time=datetime.datetime.fromtimestamp(1_700_000_000.123, datetime.UTC),
           producer_id=2**40, producer_epoch=3,
           topics=tuple(rb("TopicData", topic=t, partitions=tuple(ps)) for t, ps in topics)),
        rb("TransactionState", error_code=E.NONE, transactional_id="t-2", transaction_state="Empty",
           transaction_timeout=datetime.timedelta(milliseconds=1), transaction_start_time=0, producer_id=5,
           producer_epoch=0, topics=()),
        rb.error("TransactionState", E.INVALID_REQUEST, transactional_id="t-1", transaction_state="",
                 transaction_start_time=0)))
    got = wire.encode_response(0, [
        wire.encode_state(E.NONE, "t-1", "Ongoing", 60000, 1_700_000_000_123, 2**40, 3, topics),
        wire.encode_state(E.NONE, "t-2", "Empty", 1, 0, 5, 0, []),
        wire.encode_state(E.INVALID_REQUEST, "t-1", "", 0, 0, -1, -1, [])])
    assert got == expected
