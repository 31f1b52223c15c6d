"""DescribeTransactionsResponse (API 65, v0, flexible) written by hand: a transaction lists every
partition it holds, which a client that may write to many partitions makes long (200 transactions
of 2,000 partitions described at once are 400,000 entries, seconds to build and encode through kio
in one step of the event loop). Each transaction is encoded on its own (`encode_state`), so that a
handler can spread them over steps, and `encode_response` joins them.

Read by hand too (`decode_response`, into kio's classes): TransactionStartTimeMs is -1 for a
transactional id with no transaction started (Kafka's TransactionMetadata.txnStartTimestamp, which
Kafka's admin client reads as "no start time"), and kio refuses a negative timestamp; such a start
time is read as None (`entities.millis` gives -1 back).
An error entry holds Kafka's values for one (the generated class's defaults: handleDescribeTransactions
sets the id and the code alone): `ERROR_ENTRY`."""
from __future__ import annotations

import datetime
import struct
from collections.abc import Sequence
from typing import Any

from kio.schema.describe_transactions.v0 import response as kio
from kio.schema.errors import ErrorCode as KioErrorCode

from oncelog.protocol.primitives import I16, I32, I64, Reader, array_len, string

# (state, timeout, start time, producer id, producer epoch) of an error entry: Kafka's defaults
ERROR_ENTRY = ("", 0, 0, 0, 0)
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
# kio's classes, built from plain values (its types are NewTypes of them; None stands for -1)
_RESPONSE: Any = kio.DescribeTransactionsResponse
_STATE: Any = kio.TransactionState
_TOPIC: Any = kio.TopicData

_NO_TAGS = b"\x00"


def encode_state(error_code: int, transactional_id: str, state: str, timeout_ms: int, start_ms: int,
                 producer_id: int, producer_epoch: int, topics: Sequence[tuple[str, Sequence[int]]]) -> bytes:
    """One TransactionState with its partitions by topic."""
    out = [I16.pack(error_code), string(transactional_id, True), string(state, True), I32.pack(timeout_ms),
           I64.pack(start_ms), I64.pack(producer_id), I16.pack(producer_epoch), array_len(len(topics), True)]
    for topic, partitions in topics:
        out += (string(topic, True), array_len(len(partitions), True),
                struct.pack(f">{len(partitions)}i", *partitions), _NO_TAGS)
    out.append(_NO_TAGS)
    return b"".join(out)


def encode_error(error_code: int, transactional_id: str) -> bytes:
    """An error entry, as Kafka writes one."""
    return encode_state(error_code, transactional_id, *ERROR_ENTRY, ())


def encode_response(throttle_ms: int, states: Sequence[bytes]) -> bytes:
    return b"".join((I32.pack(throttle_ms), array_len(len(states), True), *states, _NO_TAGS))


def decode_response(body: Any) -> Any:
    """The response in kio's classes; a negative start time (none started) as None. Raises
    ValueError (or IndexError) for bytes that do not decode."""
    r = Reader(body)
    throttle = r.i32()
    states = []
    for _ in range(r.array_len(True)):
        code, tid, state = r.i16(), r.string(True), r.string(True)
        timeout, start, pid, epoch = r.i32(), r.i64(), r.i64(), r.i16()
        topics = []
        for _t in range(r.array_len(True)):
            topic = r.string(True)
            partitions = tuple(r.i32() for _p in range(r.array_len(True)))
            r.tags()
            topics.append(_TOPIC(topic=topic, partitions=partitions))
        r.tags()
        states.append(_STATE(
            error_code=KioErrorCode(code), transactional_id=tid, transaction_state=state,
            transaction_timeout=datetime.timedelta(milliseconds=timeout),
            transaction_start_time=None if start < 0 else _EPOCH + datetime.timedelta(milliseconds=start),
            producer_id=pid, producer_epoch=epoch, topics=tuple(topics)))
    r.tags()
    if r.pos != len(r.buf):
        raise ValueError(f"{len(r.buf) - r.pos} bytes after the response")
    return _RESPONSE(throttle_time=datetime.timedelta(milliseconds=throttle), transaction_states=tuple(states))
